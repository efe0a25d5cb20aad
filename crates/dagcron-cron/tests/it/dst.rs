//! Daylight saving: both sides of every 2026-2027 transition in New York,
//! Berlin, Lord Howe (a 30-minute shift) and Tokyo (no DST), for wall-clock
//! times and rhythms, with the default policies and with each override.

use dagcron_cron::{DstGap, DstOverlap, Options, Schedule};
use expect_test::{Expect, expect};
use jiff::tz::TimeZone;

use crate::{preview, ts};

fn with(expr: &str, tz: &str, gap: Option<DstGap>, overlap: Option<DstOverlap>) -> Schedule {
    let options = Options {
        time_zone: TimeZone::get(tz).unwrap(),
        dst_gap: gap,
        dst_overlap: overlap,
        ..Options::default()
    };
    Schedule::parse_with(expr, &options).unwrap()
}

/// Fires from a few hours before to a few hours after the local day of `day`.
fn around(
    expr: &str,
    tz: &str,
    from: &str,
    n: usize,
    gap: Option<DstGap>,
    overlap: Option<DstOverlap>,
    expect: Expect,
) {
    expect.assert_eq(&preview(&with(expr, tz, gap, overlap), from, n));
}

#[test]
fn new_york_spring_forward_2026() {
    // 2026-03-08 02:00 EST -> 03:00 EDT.
    let from = "2026-03-08T05:00:00Z"; // 00:00 EST
    around(
        "30 2 * * *",
        "America/New_York",
        from,
        2,
        None,
        None,
        expect![[r#"
        2026-03-08 Sun 03:00:00 -04:00  [moved: local time skipped by DST]
        2026-03-09 Mon 02:30:00 -04:00
    "#]],
    );
    around(
        "30 2 * * *",
        "America/New_York",
        from,
        2,
        Some(DstGap::Skip),
        None,
        expect![[r#"
        2026-03-09 Mon 02:30:00 -04:00
        2026-03-10 Tue 02:30:00 -04:00
    "#]],
    );
    around(
        "0,30 2 * * *",
        "America/New_York",
        from,
        2,
        None,
        None,
        expect![[r#"
        2026-03-08 Sun 03:00:00 -04:00  [collapsed: several skipped local times]
        2026-03-09 Mon 02:00:00 -04:00
    "#]],
    );
    around(
        "0 3 * * *",
        "America/New_York",
        from,
        1,
        None,
        None,
        expect![[r#"
        2026-03-08 Sun 03:00:00 -04:00
    "#]],
    );
    around(
        "*/30 1-3 * * *",
        "America/New_York",
        from,
        5,
        None,
        None,
        expect![[r#"
        2026-03-08 Sun 01:00:00 -05:00
        2026-03-08 Sun 01:30:00 -05:00
        2026-03-08 Sun 03:00:00 -04:00
        2026-03-08 Sun 03:30:00 -04:00
        2026-03-09 Mon 01:00:00 -04:00
    "#]],
    );
    around(
        "*/30 1-3 * * *",
        "America/New_York",
        from,
        5,
        Some(DstGap::Shift),
        None,
        expect![[r#"
        2026-03-08 Sun 01:00:00 -05:00
        2026-03-08 Sun 01:30:00 -05:00
        2026-03-08 Sun 03:00:00 -04:00  [collapsed: several skipped local times]
        2026-03-08 Sun 03:30:00 -04:00
        2026-03-09 Mon 01:00:00 -04:00
    "#]],
    );
}

#[test]
fn new_york_fall_back_2026() {
    // 2026-11-01 02:00 EDT -> 01:00 EST.
    let from = "2026-11-01T04:00:00Z"; // 00:00 EDT
    around(
        "30 1 * * *",
        "America/New_York",
        from,
        2,
        None,
        None,
        expect![[r#"
        2026-11-01 Sun 01:30:00 -04:00  [repeated hour: first occurrence only]
        2026-11-02 Mon 01:30:00 -05:00
    "#]],
    );
    around(
        "30 1 * * *",
        "America/New_York",
        from,
        2,
        None,
        Some(DstOverlap::Last),
        expect![[r#"
        2026-11-01 Sun 01:30:00 -05:00  [repeated hour: moved to second occurrence]
        2026-11-02 Mon 01:30:00 -05:00
    "#]],
    );
    around(
        "30 1 * * *",
        "America/New_York",
        from,
        3,
        None,
        Some(DstOverlap::Both),
        expect![[r#"
        2026-11-01 Sun 01:30:00 -04:00  [repeated hour: fires twice (1st)]
        2026-11-01 Sun 01:30:00 -05:00  [repeated hour: fires twice (2nd)]
        2026-11-02 Mon 01:30:00 -05:00
    "#]],
    );
    around(
        "0 * * * *",
        "America/New_York",
        from,
        4,
        None,
        None,
        expect![[r#"
        2026-11-01 Sun 01:00:00 -04:00  [repeated hour: fires twice (1st)]
        2026-11-01 Sun 01:00:00 -05:00  [repeated hour: fires twice (2nd)]
        2026-11-01 Sun 02:00:00 -05:00
        2026-11-01 Sun 03:00:00 -05:00
    "#]],
    );
    around(
        "0 * * * *",
        "America/New_York",
        from,
        4,
        None,
        Some(DstOverlap::First),
        expect![[r#"
        2026-11-01 Sun 01:00:00 -04:00  [repeated hour: first occurrence only]
        2026-11-01 Sun 02:00:00 -05:00
        2026-11-01 Sun 03:00:00 -05:00
        2026-11-01 Sun 04:00:00 -05:00
    "#]],
    );
    // Starting inside the first pass of the repeated hour.
    around(
        "*/20 * * * *",
        "America/New_York",
        "2026-11-01T05:50:00Z",
        4,
        None,
        None,
        expect![[r#"
        2026-11-01 Sun 01:00:00 -05:00  [repeated hour: fires twice (2nd)]
        2026-11-01 Sun 01:20:00 -05:00  [repeated hour: fires twice (2nd)]
        2026-11-01 Sun 01:40:00 -05:00  [repeated hour: fires twice (2nd)]
        2026-11-01 Sun 02:00:00 -05:00
    "#]],
    );
}

#[test]
fn new_york_2027() {
    around(
        "30 2 * * *",
        "America/New_York",
        "2027-03-14T05:00:00Z",
        1,
        None,
        None,
        expect![[r#"
        2027-03-14 Sun 03:00:00 -04:00  [moved: local time skipped by DST]
    "#]],
    );
    around(
        "30 1 * * *",
        "America/New_York",
        "2027-11-07T04:00:00Z",
        1,
        None,
        None,
        expect![[r#"
        2027-11-07 Sun 01:30:00 -04:00  [repeated hour: first occurrence only]
    "#]],
    );
}

#[test]
fn berlin_2026_and_2027() {
    // Spring: 02:00 CET -> 03:00 CEST on 2026-03-29 and 2027-03-28.
    around(
        "0 30 2 * * *",
        "Europe/Berlin",
        "2026-03-28T23:00:00Z",
        2,
        None,
        None,
        expect![[r#"
        2026-03-29 Sun 03:00:00 +02:00  [moved: local time skipped by DST]
        2026-03-30 Mon 02:30:00 +02:00
    "#]],
    );
    around(
        "0 30 2 * * *",
        "Europe/Berlin",
        "2027-03-27T23:00:00Z",
        2,
        None,
        None,
        expect![[r#"
        2027-03-28 Sun 03:00:00 +02:00  [moved: local time skipped by DST]
        2027-03-29 Mon 02:30:00 +02:00
    "#]],
    );
    // Autumn: 03:00 CEST -> 02:00 CET on 2026-10-25 and 2027-10-31.
    around(
        "0 30 2 * * *",
        "Europe/Berlin",
        "2026-10-24T22:00:00Z",
        2,
        None,
        None,
        expect![[r#"
        2026-10-25 Sun 02:30:00 +02:00  [repeated hour: first occurrence only]
        2026-10-26 Mon 02:30:00 +01:00
    "#]],
    );
    around(
        "0 */30 2 * * *",
        "Europe/Berlin",
        "2027-10-30T22:00:00Z",
        4,
        None,
        None,
        expect![[r#"
        2027-10-31 Sun 02:00:00 +02:00  [repeated hour: fires twice (1st)]
        2027-10-31 Sun 02:30:00 +02:00  [repeated hour: fires twice (1st)]
        2027-10-31 Sun 02:00:00 +01:00  [repeated hour: fires twice (2nd)]
        2027-10-31 Sun 02:30:00 +01:00  [repeated hour: fires twice (2nd)]
    "#]],
    );
}

#[test]
fn lord_howe_half_hour_shifts() {
    // Ends 2026-04-05 02:00 (+11) -> 01:30 (+10:30); starts 2026-10-04 02:00 (+10:30) -> 02:30 (+11).
    around(
        "*/15 1-2 * * *",
        "Australia/Lord_Howe",
        "2026-04-04T13:00:00Z",
        8,
        None,
        None,
        expect![[r#"
        2026-04-05 Sun 01:00:00 +11:00
        2026-04-05 Sun 01:15:00 +11:00
        2026-04-05 Sun 01:30:00 +11:00  [repeated hour: fires twice (1st)]
        2026-04-05 Sun 01:45:00 +11:00  [repeated hour: fires twice (1st)]
        2026-04-05 Sun 01:30:00 +10:30  [repeated hour: fires twice (2nd)]
        2026-04-05 Sun 01:45:00 +10:30  [repeated hour: fires twice (2nd)]
        2026-04-05 Sun 02:00:00 +10:30
        2026-04-05 Sun 02:15:00 +10:30
    "#]],
    );
    around(
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-04T13:00:00Z",
        1,
        None,
        None,
        expect![[r#"
        2026-04-05 Sun 01:45:00 +11:00  [repeated hour: first occurrence only]
    "#]],
    );
    around(
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T13:00:00Z",
        2,
        None,
        None,
        expect![[r#"
        2026-10-04 Sun 02:30:00 +11:00  [moved: local time skipped by DST]
        2026-10-05 Mon 02:15:00 +11:00
    "#]],
    );
    around(
        "*/15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T13:00:00Z",
        3,
        None,
        None,
        expect![[r#"
        2026-10-04 Sun 02:30:00 +11:00
        2026-10-04 Sun 02:45:00 +11:00
        2026-10-05 Mon 02:00:00 +11:00
    "#]],
    );
    around(
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2027-10-02T13:00:00Z",
        1,
        None,
        None,
        expect![[r#"
        2027-10-03 Sun 02:30:00 +11:00  [moved: local time skipped by DST]
    "#]],
    );
    around(
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2027-04-03T13:00:00Z",
        1,
        None,
        None,
        expect![[r#"
        2027-04-04 Sun 01:45:00 +11:00  [repeated hour: first occurrence only]
    "#]],
    );
}

#[test]
fn tokyo_has_no_transitions() {
    around(
        "30 2 * * *",
        "Asia/Tokyo",
        "2026-03-07T00:00:00Z",
        2,
        None,
        None,
        expect![[r#"
        2026-03-08 Sun 02:30:00 +09:00
        2026-03-09 Mon 02:30:00 +09:00
    "#]],
    );
    around(
        "0 * * * *",
        "Asia/Tokyo",
        "2026-11-01T00:00:00Z",
        2,
        None,
        None,
        expect![[r#"
        2026-11-01 Sun 10:00:00 +09:00
        2026-11-01 Sun 11:00:00 +09:00
    "#]],
    );
}

#[test]
fn previous_fires_agree_with_next_fires_across_transitions() {
    for (expr, tz) in [
        ("30 2 * * *", "America/New_York"),
        ("0,30 1,2 * * *", "America/New_York"),
        ("*/30 * * * *", "Europe/Berlin"),
        ("*/15 1-2 * * *", "Australia/Lord_Howe"),
        ("0 30 2 * * *", "Europe/Berlin"),
    ] {
        for (gap, overlap) in [
            (None, None),
            (Some(DstGap::Shift), Some(DstOverlap::Both)),
            (Some(DstGap::Skip), Some(DstOverlap::Last)),
        ] {
            let s = with(expr, tz, gap, overlap);
            let start = ts("2026-01-01T00:00:00Z");
            let end = ts("2028-01-01T00:00:00Z");
            let forward: Vec<_> = s.fires_after(start).take_while(|f| f.at < end).collect();
            let mut backward: Vec<_> = s.fires_before(end).take_while(|f| f.at > start).collect();
            backward.reverse();
            assert_eq!(forward, backward, "{expr} in {tz}");
            assert!(forward.len() > 700);
        }
    }
}

#[test]
fn a_fire_never_goes_back_in_time_nor_repeats() {
    // The `cron` crate fires twice in a fall-back overlap and goes back in time there.
    let s = with("0 30 1 * * *", "America/New_York", None, None);
    let fires: Vec<_> = s
        .fires_after(ts("2026-10-31T00:00:00Z"))
        .take(4)
        .map(|f| f.at)
        .collect();
    assert!(fires.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(
        fires[1],
        ts("2026-11-01T05:30:00Z"),
        "fires at the first 01:30 only"
    );
    assert_eq!(fires[2], ts("2026-11-02T06:30:00Z"));
}
