//! Explanations and normal forms, pinned.

use expect_test::{Expect, expect};

use crate::schedule;

fn check(expr: &str, tz: &str, expect: Expect) {
    let s = schedule(expr, tz);
    expect.assert_eq(&format!("{}\n{}\n", s.explain(), s.normalized()));
}

#[test]
fn explanations() {
    check(
        "0 30 2 LW * *",
        "Europe/Berlin",
        expect![[r#"
        at 02:30 on the last weekday of every month, in Europe/Berlin
        CRON_TZ=Europe/Berlin 0 30 2 LW * * *
    "#]],
    );
    check(
        "30 2 * * *",
        "UTC",
        expect![[r#"
        at 02:30 every day
        0 30 2 * * * *
    "#]],
    );
    check(
        "*/15 9-17 * * MON-FRI",
        "America/New_York",
        expect![[r#"
        every 15 minutes, between 09:00 and 17:59, on Monday through Friday, in America/New_York
        CRON_TZ=America/New_York 0 */15 9-17 * * 1-5 *
    "#]],
    );
    check(
        "0,30 9 * * *",
        "UTC",
        expect![[r#"
        at 09:00 and 09:30 every day
        0 0,30 9 * * * *
    "#]],
    );
    check(
        "0 0 1,15 * 1",
        "UTC",
        expect![[r#"
        at 00:00 on day 1 and day 15 of every month or on Monday
        0 0 0 1,15 * 1 *
    "#]],
    );
    check(
        "0 0 */2 * 1",
        "UTC",
        expect![[r#"
        at 00:00 on every 2nd day of every month if it is Monday
        0 0 0 */2 * 1 *
    "#]],
    );
    check(
        "0 0 12 * * 5L",
        "UTC",
        expect![[r#"
        at 12:00 on the last Friday of the month
        0 0 12 * * 5L *
    "#]],
    );
    check(
        "0 0 9 ? * 2#1",
        "UTC",
        expect![[r#"
        at 09:00 on the first Tuesday of the month
        0 0 9 * * 2#1 *
    "#]],
    );
    check(
        "0 0 15W * *",
        "UTC",
        expect![[r#"
        at 00:00 on the weekday nearest day 15 of every month
        0 0 0 15W * * *
    "#]],
    );
    check(
        "0 0 L-3 JAN-MAR *",
        "UTC",
        expect![[r#"
        at 00:00 on 3 days before the last day of January through March
        0 0 0 L-3 1-3 * *
    "#]],
    );
    check(
        "*/10 * * * * *",
        "UTC",
        expect![[r#"
        every 10 seconds
        */10 * * * * * *
    "#]],
    );
    check(
        "0 * * * *",
        "UTC",
        expect![[r#"
        at minute 0 of every hour
        0 0 * * * * *
    "#]],
    );
    check(
        "0 0 0 29 2 * 2028-2040/4",
        "UTC",
        expect![[r#"
        at 00:00 on day 29 of February, in every 4th year from 2028 through 2040
        0 0 0 29 2 * 2028-2040/4
    "#]],
    );
    check(
        "@every 1h30m",
        "UTC",
        expect![[r#"
        every 1 hour and 30 minutes, counted from the Unix epoch
        @every 5400s
    "#]],
    );
    check(
        "@weekly",
        "Asia/Tokyo",
        expect![[r#"
        at 00:00 on Sunday, in Asia/Tokyo
        CRON_TZ=Asia/Tokyo 0 0 0 * * 0 *
    "#]],
    );
    check(
        "H H(0-5) * * *",
        "UTC",
        expect![[r#"
        at 03:40 every day
        0 40 3 * * * *
    "#]],
    );
}

#[test]
fn equal_schedules_have_equal_normal_forms() {
    let groups: &[&[&str]] = &[
        &[
            "@daily",
            "0 0 * * *",
            "0 0 0 * * ?",
            "0 0 0 ? * * *",
            "0 0 0 1-31 * 0-7",
        ],
        &[
            "*/15 * * * *",
            "0,15,30,45 * * * *".trim(),
            "0-59/15 * * * *",
            "0/15 * * * *",
        ],
        &[
            "0 9 * * MON-FRI",
            "0 9 * * 1-5",
            "0 9 ? * mon,tue,wed,thu,fri",
            "0 0 9 * * 1,2,3-5 *",
        ],
        &["0 0 * * 0", "0 0 * * 7", "0 0 * * SUN", "@weekly"],
    ];
    for group in groups {
        let forms: Vec<String> = group
            .iter()
            .map(|e| schedule(e, "UTC").normalized())
            .collect();
        assert!(
            forms.windows(2).all(|w| w[0] == w[1]),
            "{group:?} -> {forms:?}"
        );
    }
    // Wall-clock times and rhythms differ in DST behaviour, so they differ here too.
    assert_ne!(
        schedule("0 1,2,3 * * *", "UTC").normalized(),
        schedule("0 1-3 * * *", "UTC").normalized()
    );
    assert_ne!(
        schedule("0 0 1,15 * 1", "UTC").normalized(),
        schedule("0 0 */14 * 1", "UTC").normalized()
    );
}
