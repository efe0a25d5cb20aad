//! Property tests: random expressions, zones and instants around DST
//! transitions, checked against the naive oracle by brute force over a
//! window, plus the algebra of next/previous.

use dagcron_cron::{DstGap, DstOverlap, Options, Schedule};
use jiff::Timestamp;
use jiff::tz::TimeZone;
use proptest::prelude::*;

use crate::oracle;

const ZONES: [&str; 7] = [
    "UTC",
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "Asia/Tokyo",
    "Pacific/Chatham",
    "America/Santiago",
];

fn time_field(max: u32) -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just("*".to_string()),
        2 => (1..=max / 2).prop_map(|n| format!("*/{n}")),
        2 => (0..=max).prop_map(|v| v.to_string()),
        2 => prop::collection::btree_set(0..=max, 1..4).prop_map(|s| s.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
        2 => (0..=max, 0..=max).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
        1 => (0..=max, 1..=max).prop_map(|(a, n)| format!("{a}/{n}")),
        1 => (0..=max, 0..=max, 1..10u32).prop_map(|(a, b, n)| format!("{}-{}/{n}", a.min(b), a.max(b))),
    ]
}

fn dom_field() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => Just("*".to_string()),
        1 => Just("?".to_string()),
        2 => (1..=31u32).prop_map(|v| v.to_string()),
        1 => (1..=10u32).prop_map(|n| format!("*/{n}")),
        1 => (1..=28u32, 1..=31u32).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
        1 => (0..=5u32).prop_map(|n| if n == 0 { "L".to_string() } else { format!("L-{n}") }),
        1 => Just("LW".to_string()),
        1 => (1..=31u32).prop_map(|n| format!("{n}W")),
        1 => (1..=31u32, 0..=3u32).prop_map(|(a, n)| format!("{a},L-{n}")),
    ]
}

fn dow_field() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => Just("*".to_string()),
        1 => Just("?".to_string()),
        2 => (0..=7u32).prop_map(|v| v.to_string()),
        1 => Just("MON-FRI".to_string()),
        1 => (0..=7u32, 0..=7u32).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
        1 => (0..=7u32).prop_map(|n| format!("{n}L")),
        1 => (0..=7u32, 1..=5u32).prop_map(|(n, k)| format!("{n}#{k}")),
        1 => (1..=3u32).prop_map(|n| format!("*/{n}")),
    ]
}

fn month_field() -> impl Strategy<Value = String> {
    prop_oneof![5 => Just("*".to_string()), 1 => (1..=12u32).prop_map(|v| v.to_string()), 1 => Just("3,10,11".to_string())]
}

prop_compose! {
    fn expression()(sec in prop_oneof![3 => Just("0".to_string()), 1 => time_field(59)],
                    min in time_field(59), hour in time_field(23),
                    dom in dom_field(), month in month_field(), dow in dow_field()) -> String {
        format!("{sec} {min} {hour} {dom} {month} {dow}")
    }
}

fn gap() -> impl Strategy<Value = Option<DstGap>> {
    prop_oneof![2 => Just(None), 1 => Just(Some(DstGap::Shift)), 1 => Just(Some(DstGap::Skip))]
}

fn overlap() -> impl Strategy<Value = Option<DstOverlap>> {
    prop_oneof![2 => Just(None), 1 => Just(Some(DstOverlap::First)), 1 => Just(Some(DstOverlap::Last)), 1 => Just(Some(DstOverlap::Both))]
}

/// An instant within a few hours of one of the zone's 2026-2027 transitions
/// (or anywhere in 2026-2027 for zones without one).
fn instant_near_transition(tz: &TimeZone, pick: usize, delta: i64) -> Timestamp {
    let start: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
    let end: Timestamp = "2028-01-01T00:00:00Z".parse().unwrap();
    let transitions: Vec<Timestamp> = tz
        .following(start)
        .take_while(|t| t.timestamp() < end)
        .map(|t| t.timestamp())
        .collect();
    let base = if transitions.is_empty() {
        start.as_second() + (pick as i64 % 700) * 86_400
    } else {
        transitions[pick % transitions.len()].as_second()
    };
    Timestamp::from_second(base + delta).unwrap()
}

const WINDOW: i64 = 3 * 3600;

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    /// Every fire in a window is exactly what the oracle finds second by
    /// second: nothing missing, nothing extra, in order.
    #[test]
    fn fires_match_the_oracle_near_transitions(
        expr in expression(), zone in 0..ZONES.len(), pick in 0..8usize, delta in -WINDOW..WINDOW,
        gap in gap(), overlap in overlap(), subsec in prop_oneof![Just(0i32), 1..1_000_000_000i32],
    ) {
        let tz = TimeZone::get(ZONES[zone]).unwrap();
        let options = Options { time_zone: tz.clone(), dst_gap: gap, dst_overlap: overlap, ..Options::default() };
        let Ok(s) = Schedule::parse_with(&expr, &options) else { return Ok(()) };
        let t = instant_near_transition(&tz, pick, delta);
        let t = Timestamp::new(t.as_second(), subsec).unwrap();
        let expected = oracle::fires_in(&s, Timestamp::from_second(t.as_second()).unwrap(), WINDOW);
        let window_end = t.as_second() + WINDOW;
        let got: Vec<Timestamp> = s.fires_after(t).map(|f| f.at).take_while(|a| a.as_second() <= window_end).collect();
        prop_assert_eq!(&got, &expected, "{} in {} after {}", expr, ZONES[zone], t);

        // And backwards from the end of the window.
        let end = Timestamp::from_second(window_end + 1).unwrap();
        let mut back: Vec<Timestamp> = s.fires_before(end).map(|f| f.at).take_while(|a| *a > t).collect();
        back.reverse();
        prop_assert_eq!(&back, &expected, "backwards: {} in {} before {}", expr, ZONES[zone], end);
    }

    /// next is after t and matches; prev(next(t)) <= t; next(prev(t)) >= t.
    #[test]
    fn next_and_prev_are_inverse(
        expr in expression(), zone in 0..ZONES.len(), secs in 0i64..4_102_444_800, gap in gap(), overlap in overlap(),
    ) {
        let options = Options { time_zone: TimeZone::get(ZONES[zone]).unwrap(), dst_gap: gap, dst_overlap: overlap, ..Options::default() };
        let Ok(s) = Schedule::parse_with(&expr, &options) else { return Ok(()) };
        let t = Timestamp::from_second(secs).unwrap();
        if let Some(next) = s.next_after(t) {
            prop_assert!(next > t);
            prop_assert!(s.matches(next));
            prop_assert!(oracle::fires_at(&s, next), "{} fires at {} by the engine but not by the oracle", expr, next);
            prop_assert!(s.prev_before(next).is_none_or(|p| p <= t));
        }
        if let Some(prev) = s.prev_before(t) {
            prop_assert!(prev < t);
            prop_assert!(s.matches(prev));
            prop_assert!(s.next_after(prev).is_none_or(|n| n >= t));
        }
    }

    /// The normal form parses back to a schedule with the same fires.
    #[test]
    fn normal_form_round_trips(expr in expression(), zone in 0..ZONES.len(), secs in 1_700_000_000i64..1_900_000_000) {
        let options = Options { time_zone: TimeZone::get(ZONES[zone]).unwrap(), ..Options::default() };
        let Ok(s) = Schedule::parse_with(&expr, &options) else { return Ok(()) };
        let normal = s.normalized();
        let again = Schedule::parse_with(&normal, &Options::default()).unwrap();
        prop_assert_eq!(again.normalized(), normal.clone());
        prop_assert_eq!(again.is_wall_clock(), s.is_wall_clock(), "{} -> {}", expr, normal);
        let t = Timestamp::from_second(secs).unwrap();
        let a: Vec<_> = s.fires_after(t).take(20).collect();
        let b: Vec<_> = again.fires_after(t).take(20).collect();
        prop_assert_eq!(a, b, "{} -> {}", expr, normal);
    }

    /// Arbitrary text never panics, and errors point inside the input.
    #[test]
    fn arbitrary_text_never_panics(text in "[ -~\t]{0,40}|[0-9*/,LW#?HA-Z -]{0,30}") {
        match Schedule::parse(&text) {
            Ok(_) => dagcron_cron::fuzzing::check(&text),
            Err(e) => prop_assert!(e.span.start <= e.span.end && e.span.end <= text.len()),
        }
    }
}
