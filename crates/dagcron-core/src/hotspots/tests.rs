use expect_test::{Expect, expect};
use proptest::prelude::*;

use super::*;
use crate::JobFile;

fn job(namespace: &str, name: &str, expressions: &[&str]) -> HotspotJob {
    let spec = serde_json::json!({
        "name": name,
        "schedule": expressions,
        "tasks": [{ "id": "t", "noop": true }],
    });
    let file = JobFile {
        namespace: namespace.into(),
        calendars: vec![],
        notifiers: vec![],
        notify: vec![],
        jobs: vec![serde_json::from_value(spec).unwrap()],
    };
    HotspotJob::of(&file.validate().unwrap()[0])
}

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn render(r: &Report) -> String {
    let mut out = format!(
        "[{}, {}): {} jobs, {} fires, peak {}/s{}\n",
        r.from,
        r.to,
        r.jobs,
        r.fires,
        r.peak_per_second,
        r.capped
            .map(|c| format!(", capped: {c}"))
            .unwrap_or_default()
    );
    for h in &r.hotspots {
        out.push_str(&format!("{} x{}\n", h.at, h.count));
        for j in &h.jobs {
            out.push_str(&format!(
                "  {}/{} {:?} -> {:?}\n",
                j.namespace, j.name, j.expression, j.suggestion
            ));
        }
    }
    out
}

#[test]
fn same_frequency_triggers_are_found_and_spread() {
    let jobs = vec![
        job("billing", "invoices", &["0 * * * *"]),
        job("billing", "ledger", &["@hourly"]),
        job("ops", "backup", &["0 */30 * * * *"]),
        job("ops", "spread", &["H * * * *"]),
        job("ops", "twice", &["30 10 * * *", "0 10 * * *"]),
        job("ops", "every", &["@every 15m"]),
    ];
    let query = Query::new(at("2026-03-02T09:59:59.5Z"), None, Some(3)).unwrap();
    let r = report(jobs, query, Limits::default());
    check(
        &render(&r),
        expect![[r#"
            [2026-03-02T10:00:00Z, 2026-03-02T11:00:00Z): 6 jobs, 11 fires, peak 5/s
            2026-03-02T10:00:00Z x5
              billing/invoices "0 * * * *" -> Some("H * * * *")
              billing/ledger "@hourly" -> Some("H * * * *")
              ops/backup "0 */30 * * * *" -> Some("H H/30 * * * *")
              ops/twice "0 10 * * *" -> Some("H 10 * * *")
              ops/every "@every 15m" -> Some("H/15 * * * *")
            2026-03-02T10:30:00Z x3
              ops/backup "0 */30 * * * *" -> Some("H H/30 * * * *")
              ops/twice "30 10 * * *" -> Some("H 10 * * *")
              ops/every "@every 15m" -> Some("H/15 * * * *")
        "#]],
    );
    assert!(
        r.hotspots[0].advice.contains("5 of the 5 listed"),
        "{}",
        r.hotspots[0].advice
    );
}

fn check(actual: &str, expect: Expect) {
    expect.assert_eq(actual);
}

#[test]
fn expressions_are_spread_with_h_where_a_minute_or_second_is_fixed() {
    let cases: &[(&str, Option<&str>)] = &[
        ("0 * * * *", Some("H * * * *")),
        ("30 2 * * *", Some("H 2 * * *")),
        ("*/15 * * * *", Some("H/15 * * * *")),
        ("0/10 * * * *", Some("H/10 * * * *")),
        ("0 0 * * * *", Some("H H * * * *")),
        ("0 */5 * * * *", Some("H H/5 * * * *")),
        ("*/5 * * * * *", Some("H/5 * * * * *")),
        ("0 0 9 * * * 2030", Some("H H 9 * * * 2030")),
        ("* * * * *", Some("H * * * * *")),
        ("H * * * *", Some("H H * * * *")),
        ("0,30 * * * *", Some("H 0,30 * * * *")),
        (
            "CRON_TZ=Europe/Berlin 0 9 * * MON-FRI",
            Some("CRON_TZ=Europe/Berlin H 9 * * MON-FRI"),
        ),
        ("  30   2 * * *", Some("  H   2 * * *")),
        ("@hourly", Some("H * * * *")),
        ("@daily", Some("H 0 * * *")),
        ("@midnight", Some("H 0 * * *")),
        ("@weekly", Some("H 0 * * 0")),
        ("@monthly", Some("H 0 1 * *")),
        ("@yearly", Some("H 0 1 1 *")),
        ("TZ=Asia/Tokyo @daily", Some("TZ=Asia/Tokyo H 0 * * *")),
        ("@every 30s", Some("H/30 * * * * *")),
        ("@every 1m", Some("H * * * * *")),
        ("@every 5m", Some("H/5 * * * *")),
        ("@every 1h", Some("H * * * *")),
        ("@every 6h", Some("H H/6 * * *")),
        ("@every 1d", Some("H H * * *")),
        // Nothing fixed to replace, or no cron rhythm to match.
        ("H H * * * *", None),
        ("H/10 H * * * *", None),
        ("* * * * * *", None),
        ("1-5 * * * * *", None),
        ("@every 1s", None),
        ("@every 7m", None),
        ("@every 90m", None),
        ("not cron", None),
    ];
    for (expression, want) in cases {
        let got = spread(expression);
        assert_eq!(got.as_deref(), *want, "{expression}");
        if let Some(s) = got {
            // A suggestion is itself valid, and spreads: two jobs that fire
            // together as written fire apart as suggested (for these names).
            let one = Schedule::parse_with(
                &s,
                &dagcron_cron::Options {
                    hash_seed: dagcron_cron::seed_from_key("a/one"),
                    ..Default::default()
                },
            )
            .unwrap();
            let two = Schedule::parse_with(
                &s,
                &dagcron_cron::Options {
                    hash_seed: dagcron_cron::seed_from_key("a/two"),
                    ..Default::default()
                },
            )
            .unwrap();
            let t = at("2026-01-01T00:00:00Z");
            assert_ne!(one.next_after(t), two.next_after(t), "{expression} -> {s}");
        }
    }
}

#[test]
fn advice_without_a_fixed_field_still_mentions_h() {
    let jobs = vec![
        job("a", "one", &["* * * * * *"]),
        job("a", "two", &["* * * * * *"]),
    ];
    let query = Query::new(at("2026-01-01T00:00:00Z"), Some(Dur::from_secs(60)), None).unwrap();
    let r = report(jobs, query, Limits::default());
    assert_eq!(r.peak_per_second, 2);
    assert_eq!(r.hotspots.len(), DEFAULT_TOP);
    assert_eq!(r.hotspots[0].at, at("2026-01-01T00:00:00Z"));
    assert!(r.hotspots[0].jobs.iter().all(|j| j.suggestion.is_none()));
    assert!(
        r.hotspots[0].advice.contains("`H/15` instead of `*/15`"),
        "{}",
        r.hotspots[0].advice
    );
}

#[test]
fn a_second_with_one_fire_is_not_a_hot_spot_and_paused_jobs_are_left_out_by_the_caller() {
    let jobs = vec![
        job("a", "one", &["0 * * * *"]),
        job("a", "two", &["5 * * * *"]),
    ];
    let query = Query::new(at("2026-01-01T00:00:00Z"), None, None).unwrap();
    let r = report(jobs, query, Limits::default());
    assert_eq!((r.jobs, r.fires, r.peak_per_second), (2, 2, 1));
    assert!(r.hotspots.is_empty());
}

#[test]
fn a_job_firing_every_second_for_a_day_is_counted_within_the_default_limits() {
    let jobs = vec![
        job("a", "busy", &["* * * * * *"]),
        job("a", "daily", &["@daily"]),
    ];
    let query = Query::new(at("2026-01-01T00:00:00Z"), Some(MAX_WINDOW), Some(1)).unwrap();
    let r = report(jobs, query, Limits::default());
    assert_eq!((r.jobs, r.fires, r.capped), (2, 86_401, None));
    assert_eq!(r.hotspots.len(), 1);
    assert_eq!(
        (r.hotspots[0].at, r.hotspots[0].count),
        (at("2026-01-01T00:00:00Z"), 2)
    );
}

#[test]
fn limits_stop_the_count_and_say_so() {
    let query = Query::new(at("2026-01-01T00:00:00Z"), None, None).unwrap();
    let three = || {
        vec![
            job("a", "one", &["0 * * * *"]),
            job("a", "two", &["0 * * * *"]),
            job("a", "three", &["0 * * * *"]),
        ]
    };
    let r = report(
        three(),
        query,
        Limits {
            jobs: 2,
            work: 1000,
        },
    );
    assert_eq!((r.jobs, r.capped), (2, Some(Cap::Jobs(2))));
    assert_eq!(r.hotspots[0].count, 2);
    // Each hourly job costs two searches in an hour: the first fire and the
    // one after the window. The third would need 7 searches of 6.
    let r = report(three(), query, Limits { jobs: 10, work: 5 });
    assert_eq!((r.jobs, r.fires, r.capped), (2, 2, Some(Cap::Work(5))));
    assert_eq!(r.capped.unwrap().to_string(), "at most 5 fires are counted");
    // A job firing every second does not fit in 100 searches: nothing is
    // counted after it either.
    let mut busy = vec![job("a", "busy", &["* * * * * *"])];
    busy.extend(three());
    let r = report(
        busy,
        query,
        Limits {
            jobs: 10,
            work: 100,
        },
    );
    assert_eq!((r.jobs, r.fires, r.peak_per_second), (0, 0, 0));
    assert_eq!(r.capped, Some(Cap::Work(100)));
}

#[test]
fn out_of_bounds_queries_are_refused_with_a_reason() {
    let now = at("2026-01-01T00:00:00Z");
    let err = |window: Option<Dur>, top: Option<usize>| {
        Query::new(now, window, top).unwrap_err().to_string()
    };
    check(
        &[
            err(Some(Dur::from_secs(0)), None),
            err(Some(Dur::from_secs(86_401)), None),
            err(Some(Dur::from_millis(1500)), None),
            err(None, Some(0)),
            err(None, Some(101)),
        ]
        .join("\n"),
        expect![[r#"
            the window is empty: give a duration of at least 1s, such as 30m or 1h
            a window of 1d1s is too long: at most 1d, such as 1h or 12h
            a window of 1s500ms is not a whole number of seconds (fires fall on whole seconds)
            top must be at least 1
            top 101 is too large: at most 100"#]],
    );
    assert_eq!(
        Query::new(Timestamp::MAX, None, None),
        Err(HotspotError::WindowOutOfRange)
    );
    let q = Query::new(now, None, None).unwrap();
    assert_eq!((q.window.seconds(), q.top), (3600, DEFAULT_TOP));
}

#[test]
fn the_peak_gauge_counts_the_next_hour_of_timings() {
    let jobs = [
        job("a", "one", &["*/10 * * * *"]),
        job("a", "two", &["0 * * * *"]),
        job("b", "three", &["0 30 * * * *"]),
        job("b", "late", &["0 * * * *"]),
    ];
    let window = Window::next_hour(at("2026-01-01T00:20:00Z")).unwrap();
    let peak = peak_fires_per_second(jobs.iter().map(|j| &j.timing), window, Limits::default());
    assert_eq!(
        peak,
        Peak {
            per_second: 3,
            at: Some(at("2026-01-01T01:00:00Z")),
            jobs: 4,
            capped: None,
        }
    );
    let none = peak_fires_per_second([], window, Limits::default());
    assert_eq!((none.per_second, none.at), (0, None));
}

/// One field of a random expression, from a small grammar.
fn field(max: u32) -> impl Strategy<Value = String> {
    prop_oneof![
        Just("*".to_string()),
        Just("H".to_string()),
        (0..max).prop_map(|v| v.to_string()),
        (1..max).prop_map(|n| format!("*/{n}")),
        (1..max).prop_map(|n| format!("H/{n}")),
        (0..max, 0..max).prop_map(|(a, b)| format!("{},{}", a.min(b), a.max(b))),
        (0..max, 0..max).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
    ]
}

fn expression() -> impl Strategy<Value = String> {
    prop_oneof![
        (
            field(60),
            prop_oneof![
                Just("*".to_string()),
                (0..24u32).prop_map(|h| h.to_string())
            ]
        )
            .prop_map(|(m, h)| format!("{m} {h} * * *")),
        (field(60), field(60)).prop_map(|(s, m)| format!("{s} {m} * * * *")),
        (1..900u32).prop_map(|n| format!("@every {n}s")),
        Just("@hourly".to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The counts are those of a brute-force check of every second of the
    /// window against every job's schedules; the hot seconds are the
    /// busiest, in order, and each job listed fires then.
    #[test]
    fn counts_match_a_brute_force_count(
        exprs in prop::collection::vec(prop::collection::vec(expression(), 1..3), 1..7),
        start in 1_767_225_600i64..1_767_312_000,
        nanos in prop_oneof![Just(0), 1..1_000_000_000i32],
        length in 1u64..1800,
        top in 1usize..12,
    ) {
        let jobs: Vec<HotspotJob> = exprs
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let e: Vec<&str> = e.iter().map(String::as_str).collect();
                job("p", &format!("j{i}"), &e)
            })
            .collect();
        let from = Timestamp::new(start, nanos).unwrap();
        let query = Query::new(from, Some(Dur::from_secs(length)), Some(top)).unwrap();
        let r = report(jobs.clone(), query, Limits::default());
        let end = from + SignedDuration::from_secs(length as i64);
        let first = from.as_second() + i64::from(from.subsec_nanosecond() > 0);
        let counts: Vec<(Timestamp, u32)> = (first..)
            .map(|s| Timestamp::from_second(s).unwrap())
            .take_while(|t| *t < end)
            .map(|t| {
                let n = jobs
                    .iter()
                    .filter(|j| j.timing.timetables.iter().any(|tt| tt.matches(t)))
                    .count();
                (t, n as u32)
            })
            .collect();
        let fires: u64 = counts.iter().map(|c| u64::from(c.1)).sum();
        prop_assert_eq!(r.fires, fires);
        prop_assert_eq!(r.jobs, jobs.len());
        prop_assert_eq!(r.capped, None);
        prop_assert_eq!(r.peak_per_second, counts.iter().map(|c| c.1).max().unwrap_or(0));
        let mut hot: Vec<(Timestamp, u32)> = counts.into_iter().filter(|c| c.1 >= 2).collect();
        hot.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        hot.truncate(top);
        let got: Vec<(Timestamp, u32)> = r.hotspots.iter().map(|h| (h.at, h.count)).collect();
        prop_assert_eq!(got, hot);
        for h in &r.hotspots {
            prop_assert_eq!(h.jobs.len(), (h.count as usize).min(JOBS_LISTED));
            for j in &h.jobs {
                let job = jobs.iter().find(|x| x.name == j.name).unwrap();
                prop_assert!(job.expressions.contains(&j.expression));
                let k = job.expressions.iter().position(|e| *e == j.expression).unwrap();
                prop_assert!(job.timing.timetables[k].matches(h.at));
            }
        }
    }
}
