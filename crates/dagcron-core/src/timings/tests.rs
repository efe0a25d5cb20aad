use proptest::prelude::*;

use super::*;
use crate::{JobFile, JobSpec};

const EXPRESSIONS: &[&str] = &[
    "0 0 * * * *",
    "30 */5 * * * *",
    "0 30 2 * * *",
    "H H * * * *",
    "0 H(0-29) 3 * * *",
    "@hourly",
    "@every 90s",
    "@every 1h30m",
    "CRON_TZ=Asia/Tokyo 0 0 9 * * MON-FRI",
    "0 0 12 LW * *",
];

const ZONES: &[&str] = &[
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
];

/// One generated job: name index, expressions, zone, anchor, gap and
/// overlap policies, jitter, dates, calendar, paused.
type Generated = (
    usize,
    Vec<usize>,
    usize,
    bool,
    u8,
    u8,
    bool,
    bool,
    bool,
    bool,
);

/// A job file of `jobs` (name index, expressions, zone, anchor, policies,
/// jitter, dates, calendar, paused) in JSON, as a user would write it.
fn file(jobs: &[Generated]) -> JobFile {
    let jobs: Vec<serde_json::Value> = jobs
        .iter()
        .map(|(name, exprs, zone, anchor, gap, overlap, jitter, dates, calendar, paused)| {
            let schedules: Vec<&str> = exprs.iter().map(|e| EXPRESSIONS[*e]).collect();
            let every = schedules.iter().any(|e| e.starts_with("@every"));
            let mut job = serde_json::json!({
                "name": format!("job-{name}"),
                "schedule": if schedules.len() == 1 { serde_json::json!(schedules[0]) } else { serde_json::json!(schedules) },
                "timezone": ZONES[*zone],
                "misfire": if *paused { "run_all" } else { "skip" },
                "max_catchup": 3,
                "paused": paused,
                "tasks": [{"id": "a", "noop": true}],
            });
            if *anchor && every {
                job["anchor"] = "2026-01-01T00:00:07+02:00".into();
            }
            match gap {
                1 => job["dst_gap"] = "shift".into(),
                2 => job["dst_gap"] = "skip".into(),
                _ => {}
            }
            match overlap {
                1 => job["dst_overlap"] = "first".into(),
                2 => job["dst_overlap"] = "last".into(),
                3 => job["dst_overlap"] = "both".into(),
                _ => {}
            }
            if *jitter {
                job["jitter"] = "30s".into();
            }
            if *dates {
                job["start_date"] = "2026-03-01T00:00:00Z".into();
                job["end_date"] = "2027-03-01T00:00:00Z".into();
            }
            if *calendar {
                job["exclude"] = serde_json::json!(["holidays"]);
            }
            job
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "namespace": "ns",
        "calendars": [{"name": "holidays", "timezone": "Europe/Berlin", "dates": ["12-25"], "cron": ["* * * * 1 *"]}],
        "jobs": jobs,
    }))
    .expect("a job file")
}

/// The next fires of a timing from a few instants, to compare behaviour
/// besides the structure.
fn fires(t: &Timing) -> Vec<Option<jiff::Timestamp>> {
    [
        "2026-01-01T00:00:00Z",
        "2026-03-29T00:30:00Z",
        "2026-10-25T00:59:59Z",
        "2027-06-01T12:00:00Z",
    ]
    .iter()
    .map(|s| t.next_fire_after(s.parse().unwrap()))
    .collect()
}

fn job_strategy() -> impl Strategy<Value = Generated> {
    (
        0..40usize,
        prop::collection::vec(0..EXPRESSIONS.len(), 1..3),
        0..ZONES.len(),
        any::<bool>(),
        0..3u8,
        0..4u8,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
}

proptest! {
    /// The timing read from a stored spec, with timetables shared through
    /// one cache across many jobs, is the timing of the whole job rebuilt
    /// and validated again; so is a validated job's shared timing.
    #[test]
    fn timing_from_canonical_is_the_whole_jobs(
        jobs in prop::collection::vec(job_strategy(), 1..12)
    ) {
        let mut jobs = jobs;
        jobs.sort_by_key(|j| j.0);
        jobs.dedup_by_key(|j| j.0);
        // The generator makes valid files only.
        let valid = file(&jobs).validate().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut cache = TimetableCache::new();
        let mut shared = TimetableCache::new();
        for job in &valid {
            let canonical = job.canonical();
            let whole = Job::from_canonical("ns", &canonical).unwrap().timing();
            let fast = cache.timing_from_canonical("ns", &canonical).unwrap();
            prop_assert_eq!(format!("{:?}", fast.timing), format!("{whole:?}"));
            prop_assert_eq!(fires(&fast.timing), fires(&whole));
            prop_assert_eq!(fast.file_paused, job.spec.paused);
            // What is stored for start-up reads back the same.
            let stored = cache.timing_from_canonical("ns", &job.timing_json()).unwrap();
            prop_assert_eq!(format!("{:?}", stored.timing), format!("{whole:?}"));
            prop_assert_eq!(stored.file_paused, job.spec.paused);
            prop_assert_eq!(stored.timing.rules(), job.rules());
            let from_job = job.timing_shared(&mut shared);
            prop_assert_eq!(format!("{from_job:?}"), format!("{whole:?}"));
            prop_assert_eq!(format!("{:?}", job.timing()), format!("{whole:?}"));
        }
    }
}

#[test]
fn jobs_of_the_same_schedules_share_their_timetables_and_keep_their_own_seed() {
    let spec = |name: &str, expr: &str| -> JobSpec {
        serde_json::from_value(serde_json::json!({
            "name": name, "schedule": expr, "jitter": "10s", "tasks": [{"id": "a", "noop": true}],
        }))
        .unwrap()
    };
    let jobs = JobFile {
        namespace: "ns".into(),
        calendars: vec![],
        notifiers: vec![],
        notify: vec![],
        jobs: vec![
            spec("a", "0 0 * * * *"),
            spec("b", "0 0 * * * *"),
            spec("c", "H 0 * * * *"),
            spec("d", "H 0 * * * *"),
        ],
    }
    .validate()
    .unwrap();
    let mut cache = TimetableCache::new();
    let t: Vec<Timing> = jobs
        .iter()
        .map(|j| {
            cache
                .timing_from_canonical("ns", &j.canonical())
                .unwrap()
                .timing
        })
        .collect();
    assert!(std::sync::Arc::ptr_eq(&t[0].timetables, &t[1].timetables));
    assert_ne!(t[0].jitter_seed, t[1].jitter_seed);
    // `H` depends on the job: never shared.
    assert!(!std::sync::Arc::ptr_eq(&t[2].timetables, &t[3].timetables));
    assert_eq!(cache.len(), 1);
    let shared = jobs[1].timing_shared(&mut cache);
    assert!(std::sync::Arc::ptr_eq(&shared.timetables, &t[0].timetables));
}

#[test]
fn a_stored_spec_that_no_longer_reads_is_an_error() {
    let mut cache = TimetableCache::new();
    assert!(cache.timing_from_canonical("ns", "{not json").is_err());
    let unknown_zone =
        r#"{"name":"a","schedule":"0 0 * * * *","timezone":"Mars/Olympus","tasks":[]}"#;
    assert!(cache.timing_from_canonical("ns", unknown_zone).is_err());
    let bad_expr = r#"{"name":"a","schedule":"0 0 * * * * * *","tasks":[]}"#;
    assert!(cache.timing_from_canonical("ns", bad_expr).is_err());
    assert!(cache.is_empty());
}
