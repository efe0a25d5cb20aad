//! Recurrence rules (RFC 5545 `RRULE`): checked against python-dateutil's
//! answers (committed in `tests/data`, written by `scripts/rrule-oracle`),
//! in UTC and in zones with daylight-saving rules, plus properties and the
//! behaviours dagcron chose.

use dagcron_cron::{DstGap, DstOverlap, ErrorKind, Options, Schedule};
use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone};

struct Row {
    rule: String,
    first: Vec<i64>,
    query: i64,
    after: Vec<i64>,
    never: bool,
}

fn rows() -> Vec<Row> {
    let text = include_str!("../data/rrule-dateutil.jsonl");
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let list = |k: &str| -> Vec<i64> {
                v[k].as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_i64().unwrap())
                    .collect()
            };
            Row {
                rule: v["rule"].as_str().unwrap().to_string(),
                first: list("first"),
                query: v["query"].as_i64().unwrap(),
                after: list("after"),
                never: v["never"].as_bool().unwrap_or(false),
            }
        })
        .collect()
}

/// DTSTART of a row's rule, as civil seconds since 1970 (its first line).
fn dtstart(rule: &str) -> i64 {
    let v = &rule["DTSTART:".len().."DTSTART:YYYYMMDDTHHMMSS".len()];
    let dt: DateTime = format!(
        "{}-{}-{}T{}:{}:{}",
        &v[0..4],
        &v[4..6],
        &v[6..8],
        &v[9..11],
        &v[11..13],
        &v[13..15]
    )
    .parse()
    .unwrap();
    TimeZone::UTC.to_timestamp(dt).unwrap().as_second()
}

fn in_zone(rule: &str, tz: &TimeZone) -> Result<Schedule, dagcron_cron::ParseError> {
    Schedule::parse_with(
        rule,
        &Options {
            time_zone: tz.clone(),
            ..Options::default()
        },
    )
}

#[test]
fn agrees_with_dateutil_on_thousands_of_random_rules_in_utc() {
    let rows = rows();
    assert!(rows.len() >= 2000, "{} rows", rows.len());
    let (mut agreed, mut never) = (0, 0);
    let mut disagreements = Vec::new();
    for row in &rows {
        let start = dtstart(&row.rule);
        let parsed = in_zone(&row.rule, &TimeZone::UTC);
        if row.never {
            match parsed {
                Err(e) if e.kind == ErrorKind::NeverFires => never += 1,
                Err(e) => disagreements.push(format!(
                    "{:?}: dateutil finds nothing; we refuse with {e}",
                    row.rule
                )),
                Ok(_) => disagreements.push(format!(
                    "{:?}: dateutil finds nothing; we accept it",
                    row.rule
                )),
            }
            continue;
        }
        let s = match parsed {
            Ok(s) => s,
            Err(e) => {
                disagreements.push(format!("{:?}: refused: {e}", row.rule));
                continue;
            }
        };
        let from = Timestamp::from_second(start.min(start + row.first[0]) - 1).unwrap();
        let first: Vec<i64> = s
            .fires_after(from)
            .take(row.first.len())
            .map(|f| f.at.as_second() - start)
            .collect();
        let query = Timestamp::from_second(start + row.query).unwrap();
        let after: Vec<i64> = s
            .fires_after(query)
            .take(row.after.len())
            .map(|f| f.at.as_second() - start)
            .collect();
        if first == row.first && after == row.after {
            agreed += 1;
        } else {
            disagreements.push(format!(
                "{:?}\n  dateutil first {:?}\n  dagcron  first {first:?}\n  query {}: dateutil {:?}\n                  dagcron  {after:?}",
                row.rule, row.first, row.query, row.after
            ));
        }
    }
    eprintln!(
        "{agreed} rules agree, {never} refused as never firing by both, {} disagree",
        disagreements.len()
    );
    assert!(
        disagreements.is_empty(),
        "{} of {} rules disagree; the first ones:\n{}",
        disagreements.len(),
        rows.len(),
        disagreements
            .iter()
            .take(8)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// What a wall-clock time becomes under a DST policy, computed here from
/// jiff's reading of the zone, independently of the schedule's walker.
fn instants(tz: &TimeZone, wall: i64, gap: DstGap, overlap: DstOverlap) -> Vec<i64> {
    let civil = TimeZone::UTC.to_datetime(Timestamp::from_second(wall).unwrap());
    match tz.to_ambiguous_timestamp(civil).offset() {
        AmbiguousOffset::Unambiguous { offset } => vec![wall - i64::from(offset.seconds())],
        AmbiguousOffset::Gap { before, .. } => match gap {
            DstGap::Skip => vec![],
            DstGap::Shift => {
                // The transition: the first instant after the gap.
                let late = Timestamp::from_second(wall - i64::from(before.seconds()) + 1).unwrap();
                vec![tz.preceding(late).next().unwrap().timestamp().as_second()]
            }
        },
        AmbiguousOffset::Fold { before, after } => {
            let (first, second) = (
                wall - i64::from(before.seconds()),
                wall - i64::from(after.seconds()),
            );
            match overlap {
                DstOverlap::First => vec![first],
                DstOverlap::Last => vec![second],
                DstOverlap::Both => vec![first, second],
            }
        }
    }
}

const ZONES: [&str; 10] = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "America/Sao_Paulo",
    "Pacific/Chatham",
    "America/St_Johns",
    "Europe/London",
    "Africa/Casablanca",
    "Asia/Kolkata",
    "America/Santiago",
];

#[test]
fn agrees_with_dateutil_in_zones_with_daylight_saving_rules() {
    let (mut agreed, mut compared) = (0, 0);
    let mut disagreements = Vec::new();
    for (i, row) in rows().iter().enumerate().filter(|(_, r)| !r.never) {
        let tz = TimeZone::get(ZONES[i % ZONES.len()]).unwrap();
        let Ok(s) = in_zone(&row.rule, &tz) else {
            disagreements.push(format!(
                "{:?} refused in {}",
                row.rule,
                ZONES[i % ZONES.len()]
            ));
            continue;
        };
        let start = dtstart(&row.rule);
        let walls: Vec<i64> = row.first.iter().map(|d| start + d).collect();
        let last = *walls.last().unwrap();
        // Times from walls after the last one are at or after its earliest
        // instant, so below that instant the expected list is complete.
        let below = instants(&tz, last, DstGap::Shift, DstOverlap::First)
            .into_iter()
            .chain(instants(&tz, last, DstGap::Skip, DstOverlap::Both))
            .min()
            .unwrap_or(i64::MAX);
        let mut expected: Vec<i64> = walls
            .iter()
            .flat_map(|w| instants(&tz, *w, s.dst_gap(), s.dst_overlap()))
            .filter(|t| *t < below)
            .collect();
        expected.sort_unstable();
        expected.dedup();
        let from = Timestamp::from_second(
            expected
                .first()
                .copied()
                .unwrap_or(below)
                .min(start - 50 * 3600),
        )
        .unwrap();
        let ours: Vec<i64> = s
            .fires_after(from)
            .map(|f| f.at.as_second())
            .take_while(|t| *t < below)
            .take(64)
            .collect();
        compared += 1;
        if ours == expected {
            agreed += 1;
        } else {
            disagreements.push(format!(
                "{:?} in {}\n  expected {expected:?}\n  dagcron  {ours:?}",
                row.rule,
                ZONES[i % ZONES.len()]
            ));
        }
    }
    eprintln!("{agreed} of {compared} rules agree in zones");
    assert!(
        disagreements.is_empty(),
        "{} disagree:\n{}",
        disagreements.len(),
        disagreements
            .iter()
            .take(6)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn fires(s: &Schedule, from: &str, n: usize) -> Vec<String> {
    s.fires_after(crate::ts(from))
        .take(n)
        .map(|f| f.at.to_string())
        .collect()
}

fn refused(rule: &str) -> dagcron_cron::ParseError {
    match Schedule::parse(rule) {
        Ok(_) => panic!("{rule:?} was accepted"),
        Err(e) => e,
    }
}

#[test]
fn the_last_business_day_of_the_month_at_six_in_berlin() {
    let s = crate::schedule(
        "RRULE:FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1;BYHOUR=18;BYMINUTE=0;BYSECOND=0",
        "Europe/Berlin",
    );
    expect_test::expect![[r#"
        2026-01-30 Fri 18:00:00 +01:00
        2026-02-27 Fri 18:00:00 +01:00
        2026-03-31 Tue 18:00:00 +02:00
        2026-04-30 Thu 18:00:00 +02:00
        2026-05-29 Fri 18:00:00 +02:00
        2026-06-30 Tue 18:00:00 +02:00
    "#]]
    .assert_eq(&crate::preview(&s, "2026-01-01T00:00:00Z", 6));
    assert_eq!(
        s.explain(),
        "every month on Monday, Tuesday, Wednesday, Thursday and Friday at 18:00, only the last of each month's times, in Europe/Berlin"
    );
    assert!(s.is_wall_clock());
}

#[test]
fn dtstart_with_a_zone_count_and_interval() {
    let s = Schedule::parse("DTSTART;TZID=America/New_York:20261102T093000\nRRULE:FREQ=WEEKLY;INTERVAL=2;BYDAY=MO,WE;COUNT=5").unwrap();
    assert_eq!(s.time_zone().iana_name(), Some("America/New_York"));
    expect_test::expect![[r#"
        2026-11-02 Mon 09:30:00 -05:00
        2026-11-04 Wed 09:30:00 -05:00
        2026-11-16 Mon 09:30:00 -05:00
        2026-11-18 Wed 09:30:00 -05:00
        2026-11-30 Mon 09:30:00 -05:00
    "#]]
    .assert_eq(&crate::preview(&s, "2020-01-01T00:00:00Z", 10));
    // No fire before DTSTART, none after the fifth.
    assert_eq!(s.prev_before(crate::ts("2026-11-02T14:30:00Z")), None);
    assert_eq!(s.next_after(crate::ts("2026-11-30T14:30:00Z")), None);
    assert_eq!(
        s.explain(),
        "every 2 weeks on Monday and Wednesday at 09:30, from 2026-11-02 09:30:00, 5 times, in America/New_York"
    );
}

#[test]
fn daylight_saving_follows_the_same_policies_as_cron() {
    // A daily wall-clock time in the spring-forward gap moves to the first
    // instant after it; an hourly rhythm skips the missing hour and fires
    // twice in the repeated one.
    let daily = crate::schedule(
        "DTSTART:20260307T023000\nRRULE:FREQ=DAILY",
        "America/New_York",
    );
    expect_test::expect![[r#"
        2026-03-07 Sat 02:30:00 -05:00
        2026-03-08 Sun 03:00:00 -04:00  [moved: local time skipped by DST]
        2026-03-09 Mon 02:30:00 -04:00
    "#]]
    .assert_eq(&crate::preview(&daily, "2026-03-07T00:00:00Z", 3));
    let hourly = crate::schedule(
        "DTSTART:20261101T000000\nRRULE:FREQ=HOURLY;BYMINUTE=15",
        "America/New_York",
    );
    assert!(!hourly.is_wall_clock());
    expect_test::expect![[r#"
        2026-11-01 Sun 00:15:00 -04:00
        2026-11-01 Sun 01:15:00 -04:00  [repeated hour: fires twice (1st)]
        2026-11-01 Sun 01:15:00 -05:00  [repeated hour: fires twice (2nd)]
        2026-11-01 Sun 02:15:00 -05:00
    "#]]
    .assert_eq(&crate::preview(&hourly, "2026-11-01T03:00:00Z", 4));
    // A policy given with the schedule overrides the default.
    let last = Schedule::parse_with(
        "DTSTART:20261031T013000\nRRULE:FREQ=DAILY",
        &Options {
            time_zone: TimeZone::get("America/New_York").unwrap(),
            dst_overlap: Some(DstOverlap::Last),
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(
        fires(&last, "2026-11-01T00:00:00Z", 1),
        ["2026-11-01T06:30:00Z"]
    );
}

#[test]
fn until_exdate_and_rdate() {
    // UNTIL in UTC bounds the fires as an instant; a date alone takes the
    // whole day.
    let utc = crate::schedule(
        "DTSTART:20260101T090000\nRRULE:FREQ=DAILY;UNTIL=20260103T080000Z",
        "Europe/Berlin",
    );
    assert_eq!(
        fires(&utc, "2025-12-01T00:00:00Z", 5),
        [
            "2026-01-01T08:00:00Z",
            "2026-01-02T08:00:00Z",
            "2026-01-03T08:00:00Z"
        ]
    );
    assert_eq!(
        utc.prev_before(crate::ts("2027-01-01T00:00:00Z"))
            .unwrap()
            .to_string(),
        "2026-01-03T08:00:00Z"
    );
    let day = Schedule::parse("DTSTART:20260101T090000\nRRULE:FREQ=DAILY;UNTIL=20260102").unwrap();
    assert_eq!(
        fires(&day, "2025-12-01T00:00:00Z", 5),
        ["2026-01-01T09:00:00Z", "2026-01-02T09:00:00Z"]
    );
    // EXDATE removes one time, or (VALUE=DATE) a whole day; RDATE adds one,
    // a date alone at DTSTART's time of day, even before DTSTART.
    let s = Schedule::parse(
        "DTSTART:20261221T180000\nRRULE:FREQ=DAILY;BYHOUR=9,18\nEXDATE:20261222T090000\nEXDATE;VALUE=DATE:20261224,20261225\nRDATE;VALUE=DATE:20261220\nRDATE:20261225T120000",
    )
    .unwrap();
    expect_test::expect![[r#"
        2026-12-20 Sun 18:00:00 +00:00
        2026-12-21 Mon 18:00:00 +00:00
        2026-12-22 Tue 18:00:00 +00:00
        2026-12-23 Wed 09:00:00 +00:00
        2026-12-23 Wed 18:00:00 +00:00
        2026-12-26 Sat 09:00:00 +00:00
    "#]]
    .assert_eq(&crate::preview(&s, "2026-12-01T00:00:00Z", 6));
    // An RDATE on an excluded day is excluded too (EXDATE wins, RFC 5545).
    let backward: Vec<String> = s
        .fires_before(crate::ts("2026-12-26T10:00:00Z"))
        .take(6)
        .map(|f| f.at.to_string())
        .collect();
    assert_eq!(
        backward,
        [
            "2026-12-26T09:00:00Z",
            "2026-12-23T18:00:00Z",
            "2026-12-23T09:00:00Z",
            "2026-12-22T18:00:00Z",
            "2026-12-21T18:00:00Z",
            "2026-12-20T18:00:00Z"
        ]
    );
}

#[test]
fn weekly_bysetpos_counts_whole_weeks_as_rfc_5545_says() {
    // DTSTART on a Wednesday; the first week's set is {Monday, Friday},
    // and its first (Monday) is before DTSTART, so that week has no fire.
    // python-dateutil starts the first week at DTSTART and fires on Friday.
    let s = Schedule::parse("DTSTART:20261202T090000\nRRULE:FREQ=WEEKLY;BYDAY=MO,FR;BYSETPOS=1")
        .unwrap();
    assert_eq!(
        fires(&s, "2026-11-01T00:00:00Z", 2),
        ["2026-12-07T09:00:00Z", "2026-12-14T09:00:00Z"]
    );
}

#[test]
fn the_normal_form_round_trips() {
    for rule in [
        "RRULE:FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1;BYHOUR=18;BYMINUTE=0;BYSECOND=0",
        "rrule:freq=yearly;bymonth=3;byday=-1su;byhour=2;interval=2",
        "DTSTART;TZID=Europe/Berlin:20260101T000000 RRULE:FREQ=HOURLY;INTERVAL=5;BYMINUTE=0,30;UNTIL=20270101T000000Z EXDATE:20260101T050000,20260101T100000",
        "DTSTART;VALUE=DATE:20260105\nRRULE:FREQ=WEEKLY;WKST=SU;COUNT=10\nRDATE;VALUE=DATE:20251231",
    ] {
        let s = Schedule::parse(rule).unwrap();
        let normal = s.normalized();
        let again = Schedule::parse(&normal).unwrap_or_else(|e| panic!("{normal:?}: {e}"));
        assert_eq!(again.normalized(), normal);
        assert_eq!(
            fires(&s, "2025-01-01T00:00:00Z", 40),
            fires(&again, "2025-01-01T00:00:00Z", 40),
            "{normal}"
        );
        assert_eq!(s, again);
    }
    assert_eq!(
        Schedule::parse("rrule:freq=yearly;bymonth=3;byday=-1su;byhour=2;interval=2")
            .unwrap()
            .normalized(),
        "DTSTART:19700101T000000\nRRULE:FREQ=YEARLY;INTERVAL=2;BYMONTH=3;BYDAY=-1SU;BYHOUR=2"
    );
}

#[test]
fn mistakes_are_refused_with_where_and_what_to_write() {
    let cases: &[(&str, ErrorKind, &str, &str)] = &[
        (
            "RRULE:FREQ=DAILY;BYHOURS=9",
            ErrorKind::Recurrence,
            "BYHOURS",
            "did you mean `BYHOUR`?",
        ),
        (
            "RRULE:FREQ=DAYLY",
            ErrorKind::UnknownName,
            "DAYLY",
            "did you mean `DAILY`?",
        ),
        (
            "RRULE:BYHOUR=9",
            ErrorKind::Recurrence,
            "BYHOUR=9",
            "start with `FREQ=YEARLY`",
        ),
        (
            "RRULE:FREQ=DAILY;COUNT=3;UNTIL=20270101T000000Z",
            ErrorKind::Misplaced,
            "UNTIL=20270101T000000Z",
            "keep one",
        ),
        (
            "RRULE:FREQ=MONTHLY;BYWEEKNO=3",
            ErrorKind::Misplaced,
            "BYWEEKNO=3",
            "FREQ=YEARLY",
        ),
        (
            "RRULE:FREQ=WEEKLY;BYDAY=1MO",
            ErrorKind::Misplaced,
            "BYDAY=1MO",
            "drop the number",
        ),
        (
            "RRULE:FREQ=MONTHLY;BYDAY=6MO",
            ErrorKind::Misplaced,
            "BYDAY=6MO",
            "from the end",
        ),
        (
            "RRULE:FREQ=DAILY;BYSETPOS=1",
            ErrorKind::Misplaced,
            "BYSETPOS=1",
            "BYDAY",
        ),
        (
            "RRULE:FREQ=WEEKLY",
            ErrorKind::Misplaced,
            "FREQ=WEEKLY",
            "BYDAY=MO",
        ),
        (
            "RRULE:FREQ=DAILY;BYHOUR=24",
            ErrorKind::OutOfRange,
            "24",
            "",
        ),
        (
            "RRULE:FREQ=DAILY;BYSECOND=60",
            ErrorKind::OutOfRange,
            "60",
            "0-59",
        ),
        (
            "RRULE:FREQ=DAILY;BYMONTHDAY=0",
            ErrorKind::OutOfRange,
            "0",
            "",
        ),
        (
            "RRULE:FREQ=DAILY;;BYHOUR=1",
            ErrorKind::EmptyElement,
            "",
            "",
        ),
        (
            "RRULE:FREQ=DAILY;INTERVAL=0",
            ErrorKind::OutOfRange,
            "0",
            "",
        ),
        (
            "RRULE:FREQ=DAILY;COUNT=100001",
            ErrorKind::OutOfRange,
            "100001",
            "",
        ),
        (
            "RRULE:FREQ=DAILY;BYDAY=MOO",
            ErrorKind::UnknownName,
            "MOO",
            "MO, TU",
        ),
        (
            "DTSTART:20260230T000000\nRRULE:FREQ=DAILY",
            ErrorKind::OutOfRange,
            "20260230T000000",
            "",
        ),
        (
            "DTSTART:2026-01-01\nRRULE:FREQ=DAILY",
            ErrorKind::Instant,
            "2026-01-01",
            "YYYYMMDDTHHMMSS",
        ),
        (
            "DTSTART;TZID=Europe/Berlni:20260101T000000\nRRULE:FREQ=DAILY",
            ErrorKind::TimeZone,
            "Europe/Berlni",
            "Europe/Berlin",
        ),
        (
            "DTSTART;TZID=Europe/Berlin:20260101T000000Z\nRRULE:FREQ=DAILY",
            ErrorKind::TimeZone,
            "20260101T000000Z",
            "drop the `Z`",
        ),
        (
            "DTSTART:20260101T000000",
            ErrorKind::Recurrence,
            "DTSTART:20260101T000000",
            "RRULE:FREQ=DAILY",
        ),
        (
            "RRULE:FREQ=DAILY\nRRULE:FREQ=WEEKLY;BYDAY=MO",
            ErrorKind::Recurrence,
            "RRULE",
            "one rule per schedule",
        ),
        (
            "RRULE:FREQ=DAILY\nEXDAT:20260101T000000",
            ErrorKind::Recurrence,
            "EXDAT",
            "did you mean `EXDATE`?",
        ),
        (
            "RRULE:FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30",
            ErrorKind::NeverFires,
            "",
            "BY parts",
        ),
        (
            "DTSTART:20260101T000000\nRRULE:FREQ=HOURLY;INTERVAL=2;BYHOUR=3",
            ErrorKind::NeverFires,
            "",
            "",
        ),
        (
            "DTSTART:20260101T000000\nRRULE:FREQ=DAILY;UNTIL=20251231T000000",
            ErrorKind::NeverFires,
            "",
            "",
        ),
        (
            "RRULE:FREQ=DAILY\u{a0}",
            ErrorKind::NonAscii,
            "\u{a0}",
            "plain space",
        ),
    ];
    for (rule, kind, at, help) in cases {
        let e = refused(rule);
        assert_eq!(e.kind, *kind, "{rule:?}: {e}");
        if !at.is_empty() {
            assert_eq!(&rule[e.span.start..e.span.end], *at, "{rule:?}: {e}");
        }
        assert!(
            e.suggestion.as_deref().unwrap_or("").contains(help),
            "{rule:?}: {e}"
        );
        // Every error renders without panicking, carets under the span.
        assert!(e.render(rule).contains('^'));
    }
    let long = format!(
        "RRULE:FREQ=DAILY\nEXDATE:{}",
        vec!["20260101T000000"; 600].join(",")
    );
    assert_eq!(refused(&long).kind, ErrorKind::TooLong);
}

/// Random rules, in the shape the generator of the reference data makes,
/// without needing the reference: properties any answer must have.
fn rules() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let freq = prop::sample::select(vec![
        "YEARLY", "MONTHLY", "WEEKLY", "DAILY", "HOURLY", "MINUTELY",
    ]);
    let part = prop_oneof![
        (2..12u32).prop_map(|n| format!("INTERVAL={n}")),
        prop::collection::btree_set(1..13u32, 1..3).prop_map(|s| format!("BYMONTH={}", join(s))),
        prop::collection::btree_set(prop_oneof![1..32i32, -31..0i32], 1..3)
            .prop_map(|s| format!("BYMONTHDAY={}", join(s))),
        prop::collection::btree_set(0..7usize, 1..4).prop_map(|s| format!(
            "BYDAY={}",
            s.iter()
                .map(|d| ["MO", "TU", "WE", "TH", "FR", "SA", "SU"][*d])
                .collect::<Vec<_>>()
                .join(",")
        )),
        prop::collection::btree_set(0..24u32, 1..3).prop_map(|s| format!("BYHOUR={}", join(s))),
        prop::collection::btree_set(0..60u32, 1..3).prop_map(|s| format!("BYMINUTE={}", join(s))),
        prop::sample::select(vec!["BYSETPOS=1", "BYSETPOS=-1", "BYSETPOS=2,-2"])
            .prop_map(String::from),
        (1..40u32).prop_map(|n| format!("COUNT={n}")),
        (0..2000i64).prop_map(|d| format!(
            "UNTIL={}",
            (jiff::civil::date(2026, 1, 1) + jiff::Span::new().days(d)).strftime("%Y%m%dT120000")
        )),
    ];
    (
        freq,
        prop::collection::vec(part, 0..4),
        0..3000i64,
        0..86_400i64,
    )
        .prop_map(|(f, parts, day, sec)| {
            let start = jiff::civil::date(2024, 1, 1).at(0, 0, 0, 0)
                + jiff::Span::new().days(day).seconds(sec);
            let mut seen = std::collections::BTreeMap::new();
            for p in parts {
                seen.entry(p.split('=').next().unwrap().to_string())
                    .or_insert(p);
            }
            if seen.contains_key("COUNT") {
                seen.remove("UNTIL");
            }
            let body: Vec<String> = std::iter::once(format!("FREQ={f}"))
                .chain(seen.into_values())
                .collect();
            format!(
                "DTSTART:{}\nRRULE:{}",
                start.strftime("%Y%m%dT%H%M%S"),
                body.join(";")
            )
        })
}

fn join(v: impl IntoIterator<Item = impl ToString>) -> String {
    v.into_iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

    #[test]
    fn fires_are_ordered_bounded_and_agree_both_ways(rule in rules(), zone in proptest::sample::select(ZONES.to_vec())) {
        let tz = TimeZone::get(zone).unwrap();
        let s = match in_zone(&rule, &tz) {
            Ok(s) => s,
            Err(e) => {
                proptest::prop_assert!(matches!(e.kind, ErrorKind::NeverFires | ErrorKind::Misplaced), "{rule}: {e}");
                return Ok(());
            }
        };
        let start_wall: DateTime = rule[8..23].parse::<DateTime>().or_else(|_| DateTime::strptime("%Y%m%dT%H%M%S", &rule[8..23])).unwrap();
        // Nothing before DTSTART's earliest reading in the zone.
        let earliest = tz.to_ambiguous_timestamp(start_wall).earlier().unwrap().as_second();
        let count: Option<usize> = rule.split([';', '\n', ':']).find_map(|p| p.strip_prefix("COUNT=")).map(|n| n.parse().unwrap());
        let until = rule.split([';', '\n', ':']).find_map(|p| p.strip_prefix("UNTIL=")).map(|u| DateTime::strptime("%Y%m%dT%H%M%S", u).unwrap());
        let from = crate::ts("2023-12-01T00:00:00Z");
        let ahead: Vec<Timestamp> = s.fires_after(from).take(60).map(|f| f.at).collect();
        proptest::prop_assert!(ahead.windows(2).all(|w| w[0] < w[1]), "{rule}: not increasing");
        proptest::prop_assert!(ahead.first().is_none_or(|t| t.as_second() >= earliest - 3600), "{rule}: before DTSTART");
        if let Some(n) = count {
            // COUNT counts the rule's wall-clock times: a skipped one is
            // still counted, a repeated one fired twice (a rhythm in a
            // fall-back hour) once.
            let doubled = s.fires_after(from).take(60).filter(|f| f.dst == Some(dagcron_cron::DstNote::DoubledSecond)).count();
            proptest::prop_assert!(ahead.len() <= n + doubled, "{rule}: {} fires", ahead.len());
        }
        if let Some(u) = until {
            let last = tz.to_ambiguous_timestamp(u).later().unwrap();
            proptest::prop_assert!(ahead.iter().all(|t| *t <= last + jiff::SignedDuration::from_hours(3)), "{rule}: after UNTIL");
        }
        for t in &ahead {
            proptest::prop_assert!(s.matches(*t), "{rule}: {t} does not match");
        }
        if let Some(end) = ahead.last() {
            let mut back: Vec<Timestamp> = s.fires_before(*end + jiff::SignedDuration::from_secs(1)).take_while(|t| t.at >= ahead[0]).map(|f| f.at).collect();
            back.reverse();
            proptest::prop_assert_eq!(&back, &ahead, "{}", rule);
        }
    }
}

/// Every reference rule through the fuzz target's checks: the normal form
/// parses back to the same fires, and forward and backward searches agree
/// around the ends of the timeline.
#[test]
fn every_reference_rule_passes_the_fuzz_checks() {
    for row in rows() {
        dagcron_cron::fuzzing::check(&row.rule);
    }
}

/// Inputs an attack review found, each refused or answered at once.
#[test]
fn regression_hostile_rules_are_refused_or_cheap() {
    // Odd seconds on a lattice of even ones never fire: refused by
    // arithmetic, not by walking 400 years a day at a time.
    let odd = (1..60)
        .step_by(2)
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(",");
    assert_eq!(
        refused(&format!("RRULE:FREQ=SECONDLY;INTERVAL=8;BYSECOND={odd}")).kind,
        ErrorKind::NeverFires
    );
    assert_eq!(
        refused("RRULE:FREQ=MINUTELY;INTERVAL=8;BYMINUTE=1,3,5,7").kind,
        ErrorKind::NeverFires
    );
    // A lattice that meets the allowed time of day once in 999,983 days.
    let e = refused(
        "DTSTART:20260101T000000\nRRULE:FREQ=SECONDLY;INTERVAL=999983;BYHOUR=0;BYMINUTE=0;BYSECOND=0",
    );
    assert_eq!(e.kind, ErrorKind::OutOfRange, "{e}");
    assert!(e.message.contains("999983 days"), "{e}");
    // Without BY parts the same interval is a plain rhythm.
    let plain =
        Schedule::parse("DTSTART:20260101T000000\nRRULE:FREQ=SECONDLY;INTERVAL=999983").unwrap();
    assert_eq!(
        fires(&plain, "2025-01-01T00:00:00Z", 2),
        ["2026-01-01T00:00:00Z", "2026-01-12T13:46:23Z"]
    );
    // UTC times past the last instant were a panic.
    for rule in [
        "DTSTART:99991231T000000Z\nRRULE:FREQ=DAILY",
        "RRULE:FREQ=DAILY\nEXDATE:99991231T000000Z",
        "RRULE:FREQ=DAILY\nRDATE:99991231T230000Z",
    ] {
        assert_eq!(refused(rule).kind, ErrorKind::OutOfRange, "{rule:?}");
    }
    // COUNT with a long BYSETPOS builds each period's set once.
    let hours = (0..24).map(|h| h.to_string()).collect::<Vec<_>>().join(",");
    let minutes = (0..60).map(|m| m.to_string()).collect::<Vec<_>>().join(",");
    let positions = (1..=366)
        .chain(-366..=-1)
        .map(|p: i32| p.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let many = Schedule::parse(&format!(
        "DTSTART:20260101T000000\nRRULE:FREQ=DAILY;COUNT=100000;BYHOUR={hours};BYMINUTE={minutes};BYSETPOS={positions}"
    ))
    .unwrap();
    // 732 a day, the first 366 minutes and the last 366: the 100,000th is
    // the 448th of day 137 (2026-05-17), the 82nd of the last 366 (from
    // 17:54), 19:15; nothing after it.
    let last = crate::ts("2026-05-17T19:15:00Z");
    assert_eq!(
        many.prev_before(crate::ts("2030-01-01T00:00:00Z")),
        Some(last)
    );
    assert_eq!(many.next_after(last), None);
    assert_eq!(
        many.next_after(crate::ts("2026-05-17T19:14:00Z")),
        Some(last)
    );
    // A zone on EXDATE or RDATE must be DTSTART's.
    for rule in [
        "DTSTART:20260105T080000Z\nRRULE:FREQ=DAILY\nEXDATE;TZID=Europe/Berlin:20260106T090000",
        "DTSTART:20260105T090000\nRRULE:FREQ=DAILY\nRDATE;TZID=Europe/Berlin:20260106T120000",
        "DTSTART;TZID=Asia/Tokyo:20260105T090000\nRRULE:FREQ=DAILY\nEXDATE;TZID=Europe/Berlin:20260106T090000",
    ] {
        let e = refused(rule);
        assert_eq!(e.kind, ErrorKind::TimeZone, "{rule:?}: {e}");
        assert_eq!(&rule[e.span.start..e.span.end], "Europe/Berlin");
    }
    // A UTC UNTIL before DTSTART never fires (as a local one); it bounds the
    // rule, not the RDATEs.
    assert_eq!(
        refused("DTSTART:20260101T000000Z\nRRULE:FREQ=DAILY;UNTIL=20250101T000000Z").kind,
        ErrorKind::NeverFires
    );
    let s = Schedule::parse(
        "DTSTART:20260101T000000Z\nRRULE:FREQ=DAILY;UNTIL=20260102T000000Z\nRDATE:20260301T000000Z",
    )
    .unwrap();
    assert_eq!(
        fires(&s, "2025-01-01T00:00:00Z", 5),
        [
            "2026-01-01T00:00:00Z",
            "2026-01-02T00:00:00Z",
            "2026-03-01T00:00:00Z"
        ]
    );
    // TZID=UTC written under a job in another zone stays in the normal form.
    let utc = crate::schedule(
        "DTSTART;TZID=UTC:20260101T090000\nRRULE:FREQ=DAILY",
        "Asia/Shanghai",
    );
    assert!(
        utc.normalized().starts_with("DTSTART;TZID=UTC:"),
        "{}",
        utc.normalized()
    );
    assert_eq!(
        crate::schedule(&utc.normalized(), "Asia/Shanghai")
            .next_after(crate::ts("2026-01-01T00:00:00Z")),
        utc.next_after(crate::ts("2026-01-01T00:00:00Z"))
    );
    // The most EXDATEs: the normal form parses back.
    let days: Vec<String> = (0..500)
        .map(|d| {
            (jiff::civil::date(2026, 1, 1) + jiff::Span::new().days(d))
                .strftime("%Y%m%dT090000")
                .to_string()
        })
        .collect();
    let rule = format!("RRULE:FREQ=DAILY;BYHOUR=9\nEXDATE:{}", days.join(","));
    dagcron_cron::fuzzing::check(&rule);
    let s = Schedule::parse(&rule).unwrap();
    assert_eq!(
        fires(&s, "2026-01-01T00:00:00Z", 1),
        ["2027-05-16T09:00:00Z"]
    );
}
