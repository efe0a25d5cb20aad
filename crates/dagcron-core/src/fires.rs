//! Decisions about a job's fires that the engine carries out: which fires
//! were missed (after downtime, a pause or a suspended process) and what
//! happens to each, how the next fire is armed, and whether the whole job
//! stays in memory. Time is an argument; nothing here reads a clock.

use jiff::{SignedDuration, Timestamp};

use crate::model::Timing;
use crate::policy::{self, FireOutcome};

/// A job whose next fire is this close keeps its whole definition in
/// memory; others keep only their [`Timing`] and are read from the store
/// [`PREPARE_AHEAD`] before they fire. A million hourly jobs cost a few
/// hundred bytes each this way, and a job firing every second is not read
/// every second.
pub const KEEP_JOB: SignedDuration = SignedDuration::from_secs(5);

/// Half a second: cron fires fall on whole seconds, so reading never
/// competes with the fires of the same instant.
pub const PREPARE_AHEAD: SignedDuration = SignedDuration::from_millis(500);

/// The fires a job missed, and what to do about them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missed {
    /// Each missed fire, in order, with its outcome by the misfire policy
    /// (`missed_caught_up` ones are run now, the others only recorded).
    pub fires: Vec<(Timestamp, FireOutcome)>,
    /// More fires were missed than the limit: only the first ones are listed.
    pub truncated: bool,
    /// Where the search for the next fire resumes.
    pub resume_after: Timestamp,
}

impl Missed {
    /// Whether some of the fires are to run now (their job is needed).
    pub fn runs_some(&self) -> bool {
        self.fires
            .iter()
            .any(|(_, o)| *o == FireOutcome::MissedCaughtUp)
    }
}

/// The fires of `timing` in `(since, now - grace]`, at most `max`, by its
/// misfire policy: a fire less than `grace` overdue still counts as on time.
pub fn missed(
    timing: &Timing,
    since: Timestamp,
    now: Timestamp,
    grace: SignedDuration,
    max: usize,
) -> Missed {
    let cutoff = now.checked_sub(grace).unwrap_or(now);
    let mut instants = Vec::new();
    let mut t = since;
    while let Some(next) = timing.next_fire_after(t) {
        if next > cutoff || instants.len() >= max {
            break;
        }
        instants.push(next);
        t = next;
    }
    Missed {
        truncated: instants.len() >= max,
        fires: policy::catch_up(&instants, timing.misfire, timing.max_catchup),
        resume_after: t.max(since),
    }
}

/// How to arm a job's next fire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arming {
    /// No fire to come (paused, not owned here, past its end date, or only
    /// triggered by hand): the whole job may be let go.
    Nothing,
    /// Fire `at` (its instant), handled at `handle_at` (`send_ahead` before
    /// it); the whole job stays in memory.
    Fire {
        /// The fire's instant.
        at: Timestamp,
        /// When the engine makes its run.
        handle_at: Timestamp,
    },
    /// Read the whole job at `read_at`, then arm fire `at`; the job is let
    /// go until then.
    Prepare {
        /// The fire's instant.
        at: Timestamp,
        /// When to read the job.
        read_at: Timestamp,
    },
}

/// The plan for the next fire of `timing` after `after`, at `now`: fired
/// directly if the job is in memory and the fire is near (within
/// [`KEEP_JOB`]), otherwise prepared ahead of it (at once if that is due).
pub fn arm_next(timing: &Timing, after: Timestamp, now: Timestamp, in_memory: bool) -> Arming {
    let Some(at) = timing.next_fire_after(after) else {
        return Arming::Nothing;
    };
    // A run is made `send_ahead` before its instant (usually at it).
    let handle_at = at.checked_sub(timing.send_ahead).unwrap_or(at);
    if in_memory && handle_at.duration_since(now) <= KEEP_JOB {
        Arming::Fire { at, handle_at }
    } else {
        let read_at = handle_at.checked_sub(PREPARE_AHEAD).unwrap_or(handle_at);
        Arming::Prepare { at, read_at }
    }
}

/// Whether a job with no run going on keeps its whole definition in
/// memory at `now`: only while a fire of its own is near.
pub fn keep_idle_job(timing: &Timing, now: Timestamp, armed: bool) -> bool {
    armed
        && timing
            .next_fire_after(now)
            .is_some_and(|at| at.duration_since(now) <= KEEP_JOB)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobFile;

    fn timing(extra: &str) -> Timing {
        let yaml = format!(
            "namespace: ns\njobs:\n  - name: j\n{extra}    tasks: [{{ id: a, noop: true }}]\n"
        );
        let file: JobFile = serde_saphyr::from_str(&yaml).unwrap();
        file.validate().unwrap().remove(0).timing()
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn render(m: &Missed) -> String {
        let mut out: Vec<String> = m
            .fires
            .iter()
            .map(|(t, o)| format!("{t} {}", o.as_str()))
            .collect();
        out.push(format!(
            "resume after {}{}",
            m.resume_after,
            if m.truncated { ", truncated" } else { "" }
        ));
        out.join("\n")
    }

    #[test]
    fn a_year_of_downtime_by_each_misfire_policy() {
        let since = at("2025-12-01T00:00:00Z");
        let now = at("2026-12-01T00:00:30Z");
        let grace = SignedDuration::from_secs(60);
        let run_once = timing("    schedule: '@daily'\n    misfire: run_once\n");
        let m = missed(&run_once, since, now, grace, 10_000);
        assert_eq!(
            m.fires.len(),
            364,
            "the fire of today's midnight is within the grace"
        );
        assert!(
            m.fires[..363]
                .iter()
                .all(|(_, o)| *o == FireOutcome::MissedSkipped)
        );
        assert_eq!(
            m.fires[363],
            (at("2026-11-30T00:00:00Z"), FireOutcome::MissedCaughtUp)
        );
        assert_eq!(m.resume_after, at("2026-11-30T00:00:00Z"));

        let run_all = timing("    schedule: '@daily'\n    misfire: run_all\n    max_catchup: 2\n");
        let m = missed(
            &run_all,
            at("2026-11-26T12:00:00Z"),
            now,
            SignedDuration::ZERO,
            10_000,
        );
        expect_test::expect![[r#"
            2026-11-27T00:00:00Z missed_skipped
            2026-11-28T00:00:00Z missed_skipped
            2026-11-29T00:00:00Z missed_skipped
            2026-11-30T00:00:00Z missed_caught_up
            2026-12-01T00:00:00Z missed_caught_up
            resume after 2026-12-01T00:00:00Z"#]]
        .assert_eq(&render(&m));

        let skip = timing("    schedule: '@hourly'\n    misfire: skip\n");
        let m = missed(&skip, since, now, grace, 100);
        assert!(m.truncated);
        assert_eq!(m.fires.len(), 100);
        assert!(
            m.fires
                .iter()
                .all(|(_, o)| *o == FireOutcome::MissedSkipped)
        );
        assert_eq!(
            m.resume_after, m.fires[99].0,
            "the search goes on from the last listed"
        );
    }

    #[test]
    fn nothing_missed_resumes_where_it_was() {
        let t = timing("    schedule: '@daily'\n");
        let since = at("2026-12-01T00:00:00Z");
        let m = missed(
            &t,
            since,
            at("2026-12-01T10:00:00Z"),
            SignedDuration::ZERO,
            10,
        );
        assert_eq!(
            m,
            Missed {
                fires: vec![],
                truncated: false,
                resume_after: since
            }
        );
        let manual = timing("");
        assert_eq!(
            missed(
                &manual,
                since,
                at("2027-01-01T00:00:00Z"),
                SignedDuration::ZERO,
                10
            )
            .fires,
            []
        );
    }

    #[test]
    fn missed_fires_keep_to_the_start_and_end_dates() {
        let t = timing(
            "    schedule: '@daily'\n    misfire: run_all\n    max_catchup: 100\n    end_date: '2026-11-28T12:00:00Z'\n",
        );
        let m = missed(
            &t,
            at("2026-11-25T12:00:00Z"),
            at("2026-12-01T00:00:00Z"),
            SignedDuration::ZERO,
            100,
        );
        let instants: Vec<String> = m.fires.iter().map(|(t, _)| t.to_string()).collect();
        assert_eq!(
            instants,
            [
                "2026-11-26T00:00:00Z",
                "2026-11-27T00:00:00Z",
                "2026-11-28T00:00:00Z"
            ]
        );
    }

    #[test]
    fn a_near_fire_of_a_job_in_memory_is_armed_others_are_read_ahead() {
        let t = timing("    schedule: '* * * * * *'\n");
        let now = at("2026-12-01T00:00:00.2Z");
        let next = at("2026-12-01T00:00:01Z");
        assert_eq!(
            arm_next(&t, now, now, true),
            Arming::Fire {
                at: next,
                handle_at: next
            }
        );
        assert_eq!(
            arm_next(&t, now, now, false),
            Arming::Prepare {
                at: next,
                read_at: at("2026-12-01T00:00:00.5Z")
            }
        );
        let hourly = timing("    schedule: '@hourly'\n    send_ahead: 2s\n");
        assert_eq!(
            arm_next(&hourly, now, now, true),
            Arming::Prepare {
                at: at("2026-12-01T01:00:00Z"),
                read_at: at("2026-12-01T00:59:57.5Z")
            }
        );
        let soon = at("2026-12-01T00:59:56Z");
        assert_eq!(
            arm_next(&hourly, soon, soon, true),
            Arming::Fire {
                at: at("2026-12-01T01:00:00Z"),
                handle_at: at("2026-12-01T00:59:58Z")
            }
        );
        assert_eq!(arm_next(&timing(""), now, now, true), Arming::Nothing);
    }

    #[test]
    fn an_idle_job_is_kept_only_while_a_fire_is_near() {
        let t = timing("    schedule: '*/10 * * * * *'\n");
        assert!(keep_idle_job(&t, at("2026-12-01T00:00:06Z"), true));
        assert!(!keep_idle_job(&t, at("2026-12-01T00:00:01Z"), true));
        assert!(
            !keep_idle_job(&t, at("2026-12-01T00:00:06Z"), false),
            "paused or not owned"
        );
    }
}
