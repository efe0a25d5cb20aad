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
        // A jittered fire is due at its delayed instant.
        if jittered(timing, next) > cutoff || instants.len() >= max {
            break;
        }
        instants.push(next);
        t = next;
    }
    // Fires in an exclusion calendar are suppressed, and the misfire
    // policy picks among the others.
    let (excluded, runnable): (Vec<Timestamp>, Vec<Timestamp>) = instants
        .iter()
        .partition(|at| timing.excluded_by(**at).is_some());
    let mut decided = policy::catch_up(&runnable, timing.misfire, timing.max_catchup).into_iter();
    let fires = if excluded.is_empty() {
        decided.collect()
    } else {
        instants
            .iter()
            .map(|at| match timing.excluded_by(*at) {
                Some(_) => (*at, FireOutcome::Suppressed),
                None => decided.next().expect("one decision per runnable fire"),
            })
            .collect()
    };
    Missed {
        truncated: instants.len() >= max,
        fires,
        resume_after: t.max(since),
    }
}

/// The instant the fire of `timing` at `at` is made: `at` delayed by a
/// stable amount in `[0, jitter)`, derived from the job's identity and the
/// instant (SplitMix64, never the std hasher, so every node and version
/// agrees), and kept below the gap to the next fire so that fires never
/// swap or merge. Millisecond steps; `at` itself without jitter.
pub fn jittered(timing: &Timing, at: Timestamp) -> Timestamp {
    if timing.jitter <= SignedDuration::ZERO {
        return at;
    }
    let mut bound = timing.jitter;
    if let Some(next) = timing.next_fire_after(at) {
        bound = bound.min(next.duration_since(at));
    }
    let Ok(ms) = u64::try_from(bound.as_millis()) else {
        return at;
    };
    if ms == 0 {
        return at;
    }
    let instant = (at.as_second() as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(u64::from(at.subsec_nanosecond().unsigned_abs()));
    let delay = splitmix64(timing.jitter_seed ^ splitmix64(instant)) % ms;
    at.checked_add(SignedDuration::from_millis(delay as i64))
        .unwrap_or(at)
}

/// SplitMix64's finalizer: a stable, well-mixed function of its input.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// When the engine makes the run of the fire at `at`: `send_ahead` before
/// its instant, or its jittered instant (a job has one or the other).
pub fn handle_at(timing: &Timing, at: Timestamp) -> Timestamp {
    let at = jittered(timing, at);
    at.checked_sub(timing.send_ahead).unwrap_or(at)
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
    // A run is made `send_ahead` before its instant, or at its jittered
    // instant (usually at the instant itself).
    let handle_at = handle_at(timing, at);
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

    fn timing_with_calendars(calendars: &str, extra: &str) -> Timing {
        let yaml = format!(
            "namespace: ns\ncalendars:\n{calendars}jobs:\n  - name: j\n{extra}    tasks: [{{ id: a, noop: true }}]\n"
        );
        let file: JobFile = serde_saphyr::from_str(&yaml).unwrap();
        file.validate().unwrap().remove(0).timing()
    }

    #[test]
    fn missed_fires_in_a_calendar_are_suppressed_and_the_policy_picks_among_the_others() {
        let t = timing_with_calendars(
            "  - { name: weekend, weekly: [{ days: [SAT, SUN], from: '00:00', to: '24:00' }] }\n",
            "    schedule: '@daily'\n    misfire: run_all\n    max_catchup: 2\n    exclude: [weekend]\n",
        );
        // 2026-12-05 and 06 are a Saturday and a Sunday.
        let m = missed(
            &t,
            at("2026-12-02T12:00:00Z"),
            at("2026-12-07T12:00:00Z"),
            SignedDuration::ZERO,
            100,
        );
        expect_test::expect![[r#"
            2026-12-03T00:00:00Z missed_skipped
            2026-12-04T00:00:00Z missed_caught_up
            2026-12-05T00:00:00Z suppressed
            2026-12-06T00:00:00Z suppressed
            2026-12-07T00:00:00Z missed_caught_up
            resume after 2026-12-07T00:00:00Z"#]]
        .assert_eq(&render(&m));
    }

    #[test]
    fn a_jittered_fire_is_due_at_its_delayed_instant() {
        let t = timing("    schedule: '@hourly'\n    jitter: 30m\n");
        let fire = at("2026-12-01T01:00:00Z");
        let due = jittered(&t, fire);
        assert!(due > fire, "this job and instant are delayed");
        // Just before it is due, the fire is not missed yet.
        let before = due - SignedDuration::from_millis(1);
        let m = missed(
            &t,
            at("2026-12-01T00:30:00Z"),
            before,
            SignedDuration::ZERO,
            10,
        );
        assert_eq!(m.fires, []);
        let m = missed(
            &t,
            at("2026-12-01T00:30:00Z"),
            due,
            SignedDuration::ZERO,
            10,
        );
        assert_eq!(m.fires, [(fire, FireOutcome::MissedCaughtUp)]);
        assert_eq!(
            arm_next(
                &t,
                at("2026-12-01T00:59:59Z"),
                due - SignedDuration::from_secs(1),
                true
            ),
            Arming::Fire {
                at: fire,
                handle_at: due
            }
        );
        // Pinned: the delay is part of the schedule's meaning.
        expect_test::expect!["2026-12-01T01:16:01.769Z"].assert_eq(&due.to_string());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// The jitter of a fire is in `[0, jitter)`, before the next fire,
        /// and the same for the same job and instant.
        #[test]
        fn jitter_is_bounded_before_the_next_fire_and_stable(
            name in "[a-z]{1,12}",
            secs in 1i64..7200,
            start in 1_700_000_000i64..1_900_000_000,
            every in proptest::sample::select(vec!["* * * * * *", "*/7 * * * * *", "* * * * *", "@hourly", "0 0 1,2 * *", "@every 17s"]),
        ) {
            let yaml = format!(
                "namespace: ns\njobs:\n  - name: {name}\n    schedule: '{every}'\n    jitter: {secs}s\n    tasks: [{{ id: a, noop: true }}]\n"
            );
            let file: JobFile = serde_saphyr::from_str(&yaml).unwrap();
            let t = file.validate().unwrap().remove(0).timing();
            let mut after = Timestamp::from_second(start).unwrap();
            for _ in 0..20 {
                let fire = t.next_fire_after(after).unwrap();
                let next = t.next_fire_after(fire).unwrap();
                let due = jittered(&t, fire);
                proptest::prop_assert!(due >= fire);
                proptest::prop_assert!(due.duration_since(fire) < SignedDuration::from_secs(secs));
                proptest::prop_assert!(due < next, "{due} reaches the next fire {next}");
                proptest::prop_assert_eq!(due, jittered(&t.clone(), fire));
                after = fire;
            }
        }

        /// Whatever the calendar, no excluded instant is fired: missed fires
        /// in it are suppressed, and the preview's next fire is outside it.
        #[test]
        fn an_excluded_instant_is_never_fired(
            from in 0i32..24, len in 1i32..12, day in 0usize..7,
            start in 1_700_000_000i64..1_900_000_000,
        ) {
            const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
            let calendars = format!(
                "  - {{ name: c, timezone: Europe/Berlin, weekly: [{{ days: [{}], from: '{from:02}:00', to: '{:02}:00' }}], dates: ['12-25'] }}\n",
                DAYS[day], (from + len) % 24
            );
            let yaml = format!(
                "namespace: ns\ncalendars:\n{calendars}jobs:\n  - name: j\n    schedule: '0 */20 * * * *'\n    misfire: run_all\n    max_catchup: 1000\n    exclude: [c]\n    tasks: [{{ id: a, noop: true }}]\n"
            );
            let file: JobFile = serde_saphyr::from_str(&yaml).unwrap();
            let job = file.validate().unwrap().remove(0);
            let t = job.timing();
            let since = Timestamp::from_second(start).unwrap();
            let m = missed(&t, since, since + SignedDuration::from_hours(24 * 8), SignedDuration::ZERO, 1000);
            proptest::prop_assert!(m.fires.iter().any(|(_, o)| *o == FireOutcome::Suppressed));
            for (at, outcome) in &m.fires {
                let excluded = t.excluded_by(*at).is_some();
                proptest::prop_assert_eq!(excluded, *outcome == FireOutcome::Suppressed);
            }
            let mut after = since;
            for _ in 0..50 {
                let next = job.next_unsuppressed_after(after).unwrap();
                proptest::prop_assert!(job.excluded_by(next).is_none());
                proptest::prop_assert!(job.next_fire_after(after).unwrap() <= next);
                after = next;
            }
        }
    }
}
