//! One test per syntax element, data-driven: each case pins the first fires.

use expect_test::{Expect, expect};

use crate::{preview, schedule};

/// First fires in UTC after 2026-01-01T00:00:00Z (a Thursday).
fn check(expr: &str, n: usize, expect: Expect) {
    expect.assert_eq(&preview(&schedule(expr, "UTC"), "2026-01-01T00:00:00Z", n));
}

#[test]
fn five_fields_are_minute_first() {
    check(
        "5 4 * * *",
        2,
        expect![[r#"
        2026-01-01 Thu 04:05:00 +00:00
        2026-01-02 Fri 04:05:00 +00:00
    "#]],
    );
}

#[test]
fn six_fields_are_second_first() {
    check(
        "30 5 4 * * *",
        2,
        expect![[r#"
        2026-01-01 Thu 04:05:30 +00:00
        2026-01-02 Fri 04:05:30 +00:00
    "#]],
    );
}

#[test]
fn seven_fields_end_with_the_year() {
    check(
        "0 0 12 1 JAN * 2028,2030",
        3,
        expect![[r#"
        2028-01-01 Sat 12:00:00 +00:00
        2030-01-01 Tue 12:00:00 +00:00
    "#]],
    );
}

#[test]
fn fires_are_strictly_after_the_instant() {
    // 2026-01-01T00:00:00Z matches `0 0 * * *` but is not "after" itself.
    check(
        "0 0 * * *",
        1,
        expect![[r#"
        2026-01-02 Fri 00:00:00 +00:00
    "#]],
    );
}

#[test]
fn lists_ranges_and_single_value_ranges() {
    check(
        "0 1,3-4,7-7 * * *",
        5,
        expect![[r#"
        2026-01-01 Thu 01:00:00 +00:00
        2026-01-01 Thu 03:00:00 +00:00
        2026-01-01 Thu 04:00:00 +00:00
        2026-01-01 Thu 07:00:00 +00:00
        2026-01-02 Fri 01:00:00 +00:00
    "#]],
    );
}

#[test]
fn the_three_step_forms() {
    check(
        "*/20 * * * *",
        4,
        expect![[r#"
        2026-01-01 Thu 00:20:00 +00:00
        2026-01-01 Thu 00:40:00 +00:00
        2026-01-01 Thu 01:00:00 +00:00
        2026-01-01 Thu 01:20:00 +00:00
    "#]],
    );
    check(
        "10-30/10 1 * * *",
        4,
        expect![[r#"
        2026-01-01 Thu 01:10:00 +00:00
        2026-01-01 Thu 01:20:00 +00:00
        2026-01-01 Thu 01:30:00 +00:00
        2026-01-02 Fri 01:10:00 +00:00
    "#]],
    );
    // `a/n` is `a-max/n`.
    check(
        "45/5 2 * * *",
        4,
        expect![[r#"
        2026-01-01 Thu 02:45:00 +00:00
        2026-01-01 Thu 02:50:00 +00:00
        2026-01-01 Thu 02:55:00 +00:00
        2026-01-02 Fri 02:45:00 +00:00
    "#]],
    );
}

#[test]
fn a_step_larger_than_the_range_keeps_the_start() {
    check(
        "*/100 3 * * *",
        2,
        expect![[r#"
        2026-01-01 Thu 03:00:00 +00:00
        2026-01-02 Fri 03:00:00 +00:00
    "#]],
    );
}

#[test]
fn names_in_any_case() {
    check(
        "0 0 1 feb,Apr *",
        2,
        expect![[r#"
        2026-02-01 Sun 00:00:00 +00:00
        2026-04-01 Wed 00:00:00 +00:00
    "#]],
    );
    check(
        "0 0 * * sat-SUN",
        3,
        expect![[r#"
        2026-01-03 Sat 00:00:00 +00:00
        2026-01-04 Sun 00:00:00 +00:00
        2026-01-10 Sat 00:00:00 +00:00
    "#]],
    );
}

#[test]
fn sunday_is_zero_and_seven_in_every_form() {
    let sundays = "2026-01-04 Sun 00:00:00 +00:00\n2026-01-11 Sun 00:00:00 +00:00\n";
    for expr in [
        "0 0 * * 0",
        "0 0 * * 7",
        "0 0 * * 7-7",
        "0 0 * * SUN",
        "0 0 * * 0/7",
    ] {
        assert_eq!(
            preview(&schedule(expr, "UTC"), "2026-01-01T00:00:00Z", 2),
            sundays,
            "{expr}"
        );
    }
    check(
        "0 0 * * 5-7",
        3,
        expect![[r#"
        2026-01-02 Fri 00:00:00 +00:00
        2026-01-03 Sat 00:00:00 +00:00
        2026-01-04 Sun 00:00:00 +00:00
    "#]],
    );
    check(
        "0 0 * * 7L",
        1,
        expect![[r#"
        2026-01-25 Sun 00:00:00 +00:00
    "#]],
    );
    check(
        "0 0 * * 7#1",
        1,
        expect![[r#"
        2026-01-04 Sun 00:00:00 +00:00
    "#]],
    );
}

#[test]
fn question_mark_means_any() {
    check(
        "0 0 0 ? * MON",
        2,
        expect![[r#"
        2026-01-05 Mon 00:00:00 +00:00
        2026-01-12 Mon 00:00:00 +00:00
    "#]],
    );
}

#[test]
fn day_fields_combine_with_or_when_both_are_restricted() {
    // The 1st, the 15th and every Monday.
    check(
        "0 0 1,15 * 1",
        5,
        expect![[r#"
        2026-01-05 Mon 00:00:00 +00:00
        2026-01-12 Mon 00:00:00 +00:00
        2026-01-15 Thu 00:00:00 +00:00
        2026-01-19 Mon 00:00:00 +00:00
        2026-01-26 Mon 00:00:00 +00:00
    "#]],
    );
}

#[test]
fn day_fields_combine_with_and_when_one_starts_with_a_star() {
    // Odd-numbered days that are Mondays.
    check(
        "0 0 */2 * 1",
        4,
        expect![[r#"
        2026-01-05 Mon 00:00:00 +00:00
        2026-01-19 Mon 00:00:00 +00:00
        2026-02-09 Mon 00:00:00 +00:00
        2026-02-23 Mon 00:00:00 +00:00
    "#]],
    );
}

#[test]
fn last_day_and_days_before_it() {
    check(
        "0 0 L * *",
        3,
        expect![[r#"
        2026-01-31 Sat 00:00:00 +00:00
        2026-02-28 Sat 00:00:00 +00:00
        2026-03-31 Tue 00:00:00 +00:00
    "#]],
    );
    check(
        "0 0 L-2 * *",
        2,
        expect![[r#"
        2026-01-29 Thu 00:00:00 +00:00
        2026-02-26 Thu 00:00:00 +00:00
    "#]],
    );
}

#[test]
fn last_weekday_of_the_month() {
    // January 31, 2026 is a Saturday, May 31 a Sunday.
    check(
        "0 0 LW * *",
        5,
        expect![[r#"
        2026-01-30 Fri 00:00:00 +00:00
        2026-02-27 Fri 00:00:00 +00:00
        2026-03-31 Tue 00:00:00 +00:00
        2026-04-30 Thu 00:00:00 +00:00
        2026-05-29 Fri 00:00:00 +00:00
    "#]],
    );
}

#[test]
fn nearest_weekday_never_leaves_the_month() {
    // August 1, 2026 is a Saturday: 1W moves forward to Monday the 3rd.
    check(
        "0 0 1W 8 *",
        1,
        expect![[r#"
        2026-08-03 Mon 00:00:00 +00:00
    "#]],
    );
    // May 31, 2026 is a Sunday: 31W moves back to Friday the 29th.
    check(
        "0 0 31W 5 *",
        1,
        expect![[r#"
        2026-05-29 Fri 00:00:00 +00:00
    "#]],
    );
    // January 10, 2026 is a Saturday (-> Friday 9th); 11 a Sunday (-> Monday 12th).
    check(
        "0 0 10W,11W 1 *",
        2,
        expect![[r#"
        2026-01-09 Fri 00:00:00 +00:00
        2026-01-12 Mon 00:00:00 +00:00
    "#]],
    );
    // 31W skips months without a 31st.
    check(
        "0 0 31W * *",
        3,
        expect![[r#"
        2026-01-30 Fri 00:00:00 +00:00
        2026-03-31 Tue 00:00:00 +00:00
        2026-05-29 Fri 00:00:00 +00:00
    "#]],
    );
}

#[test]
fn last_and_nth_weekday_of_the_month() {
    check(
        "0 0 * * 5L",
        3,
        expect![[r#"
        2026-01-30 Fri 00:00:00 +00:00
        2026-02-27 Fri 00:00:00 +00:00
        2026-03-27 Fri 00:00:00 +00:00
    "#]],
    );
    check(
        "0 0 * * MON#2",
        2,
        expect![[r#"
        2026-01-12 Mon 00:00:00 +00:00
        2026-02-09 Mon 00:00:00 +00:00
    "#]],
    );
    // A fifth Thursday exists only in some months.
    check(
        "0 0 * * 4#5",
        3,
        expect![[r#"
        2026-01-29 Thu 00:00:00 +00:00
        2026-04-30 Thu 00:00:00 +00:00
        2026-07-30 Thu 00:00:00 +00:00
    "#]],
    );
}

#[test]
fn february_29() {
    check(
        "0 0 29 2 *",
        3,
        expect![[r#"
        2028-02-29 Tue 00:00:00 +00:00
        2032-02-29 Sun 00:00:00 +00:00
        2036-02-29 Fri 00:00:00 +00:00
    "#]],
    );
}

#[test]
fn descriptors() {
    let cases = [
        ("@yearly", "0 0 0 1 1 * *"),
        ("@annually", "0 0 0 1 1 * *"),
        ("@monthly", "0 0 0 1 * * *"),
        ("@weekly", "0 0 0 * * 0 *"),
        ("@daily", "0 0 0 * * * *"),
        ("@midnight", "0 0 0 * * * *"),
        ("@hourly", "0 0 * * * * *"),
        ("@every 1h30m", "@every 5400s"),
    ];
    for (expr, normal) in cases {
        assert_eq!(schedule(expr, "UTC").normalized(), normal, "{expr}");
    }
}

#[test]
fn every_is_aligned_to_the_epoch_or_an_anchor() {
    check(
        "@every 90s",
        3,
        expect![[r#"
        2026-01-01 Thu 00:01:30 +00:00
        2026-01-01 Thu 00:03:00 +00:00
        2026-01-01 Thu 00:04:30 +00:00
    "#]],
    );
    let options = dagcron_cron::Options {
        anchor: Some(crate::ts("2026-01-01T00:00:07Z")),
        ..Default::default()
    };
    let s = dagcron_cron::Schedule::parse_with("@every 1m", &options).unwrap();
    assert_eq!(
        s.next_after(crate::ts("2026-01-01T00:00:00Z")),
        Some(crate::ts("2026-01-01T00:00:07Z"))
    );
    assert_eq!(
        s.prev_before(crate::ts("2026-01-01T00:00:07Z")),
        Some(crate::ts("2025-12-31T23:59:07Z"))
    );
}

#[test]
fn at_fires_once_at_its_instant() {
    let s = schedule("@at 2027-01-15T09:30:00+01:00", "America/New_York");
    let at = crate::ts("2027-01-15T08:30:00Z");
    assert_eq!(s.next_after(crate::ts("2000-01-01T00:00:00Z")), Some(at));
    assert_eq!(s.next_after(at), None, "it fires once");
    assert_eq!(s.prev_before(crate::ts("2030-01-01T00:00:00Z")), Some(at));
    assert_eq!(s.prev_before(at), None);
    assert!(s.matches(at));
    assert!(!s.matches(crate::ts("2027-01-15T08:30:01Z")));
    assert_eq!(s.fires_after(crate::ts("2000-01-01T00:00:00Z")).count(), 1);
    // The instant is absolute: the zone does not move it, and the normal
    // form names it in UTC.
    assert_eq!(s.normalized(), "@at 2027-01-15T08:30:00Z");
    assert_eq!(s.explain(), "once, at 2027-01-15T08:30:00Z");
    assert_eq!(
        schedule(&s.normalized(), "UTC").next_after(crate::ts("2000-01-01T00:00:00Z")),
        Some(at)
    );
}

#[test]
fn time_zone_prefixes_override_the_option() {
    let s = schedule("CRON_TZ=Asia/Tokyo 0 9 * * *", "America/New_York");
    assert_eq!(
        s.next_after(crate::ts("2026-01-01T00:00:00Z")),
        Some(
            crate::ts("2026-01-01T00:00:00Z")
                .checked_add(jiff::SignedDuration::from_hours(24))
                .unwrap()
        )
    );
    let s = schedule("TZ=Europe/Berlin 0 9 * * *", "UTC");
    assert_eq!(
        s.next_after(crate::ts("2026-01-01T00:00:00Z")),
        Some(crate::ts("2026-01-01T08:00:00Z"))
    );
}

#[test]
fn hash_is_stable_per_seed_and_spreads_across_seeds() {
    use dagcron_cron::{Options, Schedule, seed_from_key};
    let at = |key: &str, expr: &str| {
        Schedule::parse_with(
            expr,
            &Options {
                hash_seed: seed_from_key(key),
                ..Options::default()
            },
        )
        .unwrap()
        .normalized()
    };
    // Same key, same schedule, every time.
    assert_eq!(
        at("billing/reconcile", "H H * * *"),
        at("billing/reconcile", "H H * * *")
    );
    // Pinned: changing the hash would move every hashed job's fires.
    assert_eq!(at("billing/reconcile", "H H * * *"), "0 5 19 * * * *");
    assert_eq!(
        at("billing/reconcile", "H(0-29)/10 * * * *"),
        "0 5-25/10 * * * * *"
    );
    // Different keys spread over the hour.
    let minutes: std::collections::BTreeSet<String> = (0..200)
        .map(|i| at(&format!("job-{i}"), "H * * * *"))
        .collect();
    assert!(
        minutes.len() > 40,
        "only {} distinct minutes for 200 jobs",
        minutes.len()
    );
}

#[test]
fn surrounding_whitespace_and_tabs() {
    check(
        " 0\t12 * *  * \n",
        1,
        expect![[r#"
        2026-01-01 Thu 12:00:00 +00:00
    "#]],
    );
}

#[test]
fn previous_fires_walk_backwards() {
    let s = schedule("0 0 LW * *", "UTC");
    let back: Vec<String> = s
        .fires_before(crate::ts("2026-03-01T00:00:00Z"))
        .take(3)
        .map(|f| f.at.to_string())
        .collect();
    assert_eq!(
        back,
        [
            "2026-02-27T00:00:00Z",
            "2026-01-30T00:00:00Z",
            "2025-12-31T00:00:00Z"
        ]
    );
}

#[test]
fn matches_is_exact() {
    let s = schedule("0 30 9 * * MON-FRI", "UTC");
    assert!(s.matches(crate::ts("2026-01-02T09:30:00Z")));
    assert!(!s.matches(crate::ts("2026-01-03T09:30:00Z"))); // Saturday
    assert!(!s.matches(crate::ts("2026-01-02T09:30:00.5Z")));
}

#[test]
fn no_panic_or_fire_beyond_the_supported_years() {
    let s = schedule("0 0 0 1 1 * 2099", "UTC");
    assert_eq!(s.next_after(crate::ts("2099-01-01T00:00:00Z")), None);
    assert_eq!(s.prev_before(crate::ts("2099-01-01T00:00:00Z")), None);
    let s = schedule("* * * * * *", "Pacific/Kiritimati");
    assert_eq!(s.next_after(jiff::Timestamp::MAX), None);
    assert!(s.prev_before(jiff::Timestamp::MIN).is_none());
    assert!(s.next_after(jiff::Timestamp::MIN).is_some());
}

#[test]
fn regression_year_step_keeps_its_bounds_in_the_normal_form() {
    // Found by fuzzing: `*/1` in the year field means 1970-2099, not every year.
    let s = schedule("0 0 */11 * */1 0 */1", "UTC");
    assert_eq!(s.normalized(), "0 0 */11 * * 0 1970-2099");
    assert_eq!(
        s.next_after(jiff::Timestamp::MIN),
        Some(crate::ts("1970-01-04T00:00:00Z"))
    );
}

#[test]
fn regression_only_spaces_and_tabs_separate_fields() {
    assert!(dagcron_cron::Schedule::parse("0\n0 * * *").is_err());
    assert!(dagcron_cron::Schedule::parse("0 0 * * *\n").is_ok());
}

#[test]
fn regression_huge_steps_do_not_overflow() {
    // Found by fuzzing: a step near u32::MAX overflowed the set builder.
    let s = schedule("0 0 5/4294967295 * * * 1970-2099/4294967295", "UTC");
    // A step makes it a rhythm, which the normal form keeps with `5-5`.
    assert_eq!(s.normalized(), "0 0 5-5 * * * 1970");
}
