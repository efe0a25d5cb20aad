//! Every rejection SPEC.md lists, with the rendered error pinned: position,
//! message and suggestion.

use dagcron_cron::{ErrorKind, Schedule};
use expect_test::{Expect, expect};

fn check(expr: &str, kind: ErrorKind, expect: Expect) {
    let err = Schedule::parse(expr).expect_err(expr);
    assert_eq!(err.kind, kind, "{expr}: {err}");
    expect.assert_eq(&err.render(expr));
}

#[test]
fn out_of_range_values() {
    check(
        "60 * * * *",
        ErrorKind::OutOfRange,
        expect![[r#"
        error: 60 is out of range for the minute field
          |
          | 60 * * * *
          | ^^
          = help: minutes are 0-59
    "#]],
    );
    check(
        "0 24 * * *",
        ErrorKind::OutOfRange,
        expect![[r#"
        error: 24 is out of range for the hour field
          |
          | 0 24 * * *
          |   ^^
          = help: hours are 0-23; midnight is 0
    "#]],
    );
    check(
        "0 0 0 * *",
        ErrorKind::OutOfRange,
        expect![[r#"
        error: 0 is out of range for the day-of-month field
          |
          | 0 0 0 * *
          |     ^
          = help: days of the month start at 1; `L` is the last day
    "#]],
    );
    check(
        "0 0 * 13 *",
        ErrorKind::OutOfRange,
        expect![[r#"
        error: 13 is out of range for the month field
          |
          | 0 0 * 13 *
          |       ^^
          = help: accepted: 1-12
    "#]],
    );
    check(
        "0 0 * * 8",
        ErrorKind::OutOfRange,
        expect![[r#"
        error: 8 is out of range for the day-of-week field
          |
          | 0 0 * * 8
          |         ^
          = help: weekdays are 0-7, where 0 and 7 are Sunday (1 is Monday)
    "#]],
    );
    check(
        "0 0 0 1 1 * 2100",
        ErrorKind::OutOfRange,
        expect![[r#"
        error: 2100 is out of range for the year field
          |
          | 0 0 0 1 1 * 2100
          |             ^^^^
          = help: accepted: 1970-2099
    "#]],
    );
    check(
        "0 0 * * 99999999999999",
        ErrorKind::OutOfRange,
        expect![[r#"
        error: 4294967295 is out of range for the day-of-week field
          |
          | 0 0 * * 99999999999999
          |         ^^^^^^^^^^^^^^
          = help: weekdays are 0-7, where 0 and 7 are Sunday (1 is Monday)
    "#]],
    );
}

#[test]
fn reversed_ranges_suggest_the_wrap_around() {
    check(
        "5-1 * * * *",
        ErrorKind::ReversedRange,
        expect![[r#"
        error: the range `5-1` runs backwards
          |
          | 5-1 * * * *
          | ^^^
          = help: to wrap around, write `5-59,0-1`
    "#]],
    );
    check(
        "0 0 * NOV-FEB *",
        ErrorKind::ReversedRange,
        expect![[r#"
        error: the range `NOV-FEB` runs backwards
          |
          | 0 0 * NOV-FEB *
          |       ^^^^^^^
          = help: to wrap around, write `NOV-DEC,JAN-FEB`
    "#]],
    );
    check(
        "0 0 * * 6-0",
        ErrorKind::ReversedRange,
        expect![[r#"
        error: the range `6-0` runs backwards
          |
          | 0 0 * * 6-0
          |         ^^^
          = help: write `6-7`: 7 is Sunday too
    "#]],
    );
}

#[test]
fn step_zero() {
    check(
        "*/0 * * * *",
        ErrorKind::ZeroStep,
        expect![[r#"
        error: a step of 0 never advances
          |
          | */0 * * * *
          |   ^
          = help: use a step of 1 or more, such as `*/5`
    "#]],
    );
}

#[test]
fn empty_fields_and_elements() {
    check(
        "1,,2 * * * *",
        ErrorKind::EmptyElement,
        expect![[r#"
        error: empty element in the minute field
          |
          | 1,,2 * * * *
          |  ^^
          = help: remove the extra comma: list elements are separated by exactly one `,`
    "#]],
    );
    check(
        "1, * * * *",
        ErrorKind::EmptyElement,
        expect![[r#"
        error: the minute field ends with a comma
          |
          | 1, * * * *
          |  ^
          = help: remove the trailing comma
    "#]],
    );
    check(
        "",
        ErrorKind::Empty,
        expect![[r#"
        error: the expression is empty
          |
          | 
          | ^
          = help: write 5 to 7 fields, such as `*/5 * * * *` (every 5 minutes), or a descriptor such as `@daily`
    "#]],
    );
}

#[test]
fn wrong_field_counts_say_what_is_accepted() {
    check(
        "* * * *",
        ErrorKind::FieldCount,
        expect![[r#"
        error: expected 5, 6 or 7 fields, found 4
          |
          | * * * *
          | ^^^^^^^
          = help: accepted: 5 fields (minute hour day-of-month month day-of-week), 6 fields (second first) or 7 fields (second first, year last)
    "#]],
    );
    check(
        "0 0 0 1 1 * 2030 x y",
        ErrorKind::FieldCount,
        expect![[r#"
        error: too many fields: found 9, expected 5, 6 or 7
          |
          | 0 0 0 1 1 * 2030 x y
          |                  ^^^
          = help: accepted: 5 fields (minute hour day-of-month month day-of-week), 6 fields (second first) or 7 fields (second first, year last)
    "#]],
    );
}

#[test]
fn unknown_names_get_a_spelling_suggestion() {
    check(
        "0 0 * * MOM",
        ErrorKind::UnknownName,
        expect![[r#"
        error: unknown name `MOM` in the day-of-week field
          |
          | 0 0 * * MOM
          |         ^^^
          = help: did you mean `MON`?
    "#]],
    );
    check(
        "0 0 * MON *",
        ErrorKind::UnknownName,
        expect![[r#"
        error: unknown name `MON` in the month field
          |
          | 0 0 * MON *
          |       ^^^
          = help: `MON` is a weekday name; this field takes JAN, FEB, MAR, APR, MAY, JUN, JUL, AUG, SEP, OCT, NOV, DEC
    "#]],
    );
    check(
        "0 0 * * MONDAY",
        ErrorKind::UnknownName,
        expect![[r#"
        error: unknown name `MONDAY` in the day-of-week field
          |
          | 0 0 * * MONDAY
          |         ^^^^^^
          = help: accepted names: SUN, MON, TUE, WED, THU, FRI, SAT
    "#]],
    );
    check(
        "abc * * * *",
        ErrorKind::UnknownName,
        expect![[r#"
        error: unknown name `abc` in the minute field
          |
          | abc * * * *
          | ^^^
          = help: the minute field takes numbers 0-59, not names
    "#]],
    );
}

#[test]
fn trailing_garbage_and_stray_characters() {
    check(
        "0 0 * * 1-5x",
        ErrorKind::UnknownName,
        expect![[r#"
        error: unknown name `x` in the day-of-week field
          |
          | 0 0 * * 1-5x
          |            ^
          = help: accepted names: SUN, MON, TUE, WED, THU, FRI, SAT
    "#]],
    );
    check(
        "0 0 * * 1-",
        ErrorKind::UnexpectedChar,
        expect![[r#"
        error: `-` must be followed by a number
          |
          | 0 0 * * 1-
          |          ^
          = help: accepted: a number 0-7 (0 and 7 are Sunday) or a name SUN-SAT, `*`, a range `a-b`, a step `*/n`, `a/n` or `a-b/n`, `H`, `?`, `nL`, `n#k`, or a comma-separated list of these
    "#]],
    );
    check(
        "*/5/2 * * * *",
        ErrorKind::UnexpectedChar,
        expect![[r#"
        error: unexpected `/2` in the minute field
          |
          | */5/2 * * * *
          |    ^^
          = help: accepted: a number 0-59, `*`, a range `a-b`, a step `*/n`, `a/n` or `a-b/n`, `H`, or a comma-separated list of these
    "#]],
    );
    check(
        "0 0 * * 1;2",
        ErrorKind::UnexpectedChar,
        expect![[r#"
        error: unexpected character `;`
          |
          | 0 0 * * 1;2
          |          ^
          = help: fields use digits, names and `* , - / ? # L W H`
    "#]],
    );
}

#[test]
fn non_ascii_characters() {
    check(
        "0\u{a0}0 * * *",
        ErrorKind::NonAscii,
        expect![[r#"
        error: character '\u{a0}' (U+00A0) is not allowed: cron expressions are plain ASCII
          |
          | 0\u{a0}0 * * *
          |  ^^^^^^
          = help: replace it with a plain space
    "#]],
    );
    check(
        "0 9-17 * * 1\u{2013}5",
        ErrorKind::NonAscii,
        expect![[r#"
        error: character '–' (U+2013) is not allowed: cron expressions are plain ASCII
          |
          | 0 9-17 * * 1\u{2013}5
          |             ^^^^^^^^
          = help: replace it with a plain hyphen `-`
    "#]],
    );
}

#[test]
fn misplaced_specials() {
    check(
        "? * * * *",
        ErrorKind::Misplaced,
        expect![[r#"
        error: `?` is not allowed in the minute field: it means "any" in day-of-month or day-of-week only
          |
          | ? * * * *
          | ^
          = help: use `*` here
    "#]],
    );
    check(
        "0 0 ?,1 * *",
        ErrorKind::Misplaced,
        expect![[r#"
        error: `?` must stand alone in its field
          |
          | 0 0 ?,1 * *
          |     ^
          = help: write `?` by itself, or list the values you want
    "#]],
    );
    check(
        "0 0 * * L",
        ErrorKind::Misplaced,
        expect![[r#"
        error: `L` alone is not allowed in the day-of-week field: dialects disagree on what it means there
          |
          | 0 0 * * L
          |         ^
          = help: write `5L` for the last Friday of the month, or `L` in day-of-month for the last day
    "#]],
    );
    check(
        "0 0 5L * *",
        ErrorKind::Misplaced,
        expect![[r#"
        error: `nL` is not allowed in the day-of-month field: it means "last n-day of the month" in day-of-week only
          |
          | 0 0 5L * *
          |      ^
          = help: in day-of-month, `L` alone is the last day and `L-n` counts back from it
    "#]],
    );
    check(
        "0 0 * * 1#6",
        ErrorKind::OutOfRange,
        expect![[r#"
        error: there is no 6th weekday of the same kind in a month
          |
          | 0 0 * * 1#6
          |           ^
          = help: `n#k` takes k from 1 to 5
    "#]],
    );
    check(
        "0 0 0 1 1 * H",
        ErrorKind::Misplaced,
        expect![[r#"
        error: `H` is not allowed in the year field: a hashed year would rarely fire
          |
          | 0 0 0 1 1 * H
          |             ^
          = help: write the years explicitly
    "#]],
    );
}

#[test]
fn expressions_that_can_never_fire_say_why() {
    check(
        "0 0 30 2 *",
        ErrorKind::NeverFires,
        expect![[r#"
        error: this expression can never fire: day 30 never occurs in February
          |
          | 0 0 30 2 *
          |     ^^^^
          = help: check the day-of-month against the lengths of the chosen months (February has 28 or 29 days; April, June, September and November 30)
    "#]],
    );
    check(
        "0 0 31 4,6,9,11 *",
        ErrorKind::NeverFires,
        expect![[r#"
        error: this expression can never fire: day 31 never occurs in April, June, September and November
          |
          | 0 0 31 4,6,9,11 *
          |     ^^^^^^^^^^^
          = help: check the day-of-month against the lengths of the chosen months (February has 28 or 29 days; April, June, September and November 30)
    "#]],
    );
    check(
        "0 0 0 29 2 ? 2027",
        ErrorKind::NeverFires,
        expect![[r#"
        error: this expression can never fire: day 29 February does not occur in 2027
          |
          | 0 0 0 29 2 ? 2027
          |       ^^^^^^^^^^^
          = help: check the day-of-month against the lengths of the chosen months (February has 28 or 29 days; April, June, September and November 30)
    "#]],
    );
    check(
        "0 0 */30 2 1#5",
        ErrorKind::NeverFires,
        expect![[r#"
        error: this expression can never fire: no day is both every 30th day and the fifth Monday in February
          |
          | 0 0 */30 2 1#5
          |     ^^^^^^^^^^
          = help: check the day-of-month against the lengths of the chosen months (February has 28 or 29 days; April, June, September and November 30)
    "#]],
    );
}

#[test]
fn descriptors_and_durations() {
    check(
        "@reboot",
        ErrorKind::Descriptor,
        expect![[r#"
        error: `@reboot` is not a schedule: a dagcron job does not belong to one machine's boot
          |
          | @reboot
          | ^^^^^^^
          = help: trigger the job through the API or `dagcron jobs trigger` when your service starts
    "#]],
    );
    check(
        "@daliy",
        ErrorKind::Descriptor,
        expect![[r#"
        error: unknown descriptor `@daliy`
          |
          | @daliy
          | ^^^^^^
          = help: did you mean `@daily`?
    "#]],
    );
    check(
        "@at 2027-01-15 09:30",
        ErrorKind::UnexpectedChar,
        expect![[r#"
            error: unexpected text after the instant
              |
              | @at 2027-01-15 09:30
              |                ^^^^^
              = help: write the instant without spaces, with a `T` between date and time
        "#]],
    );
    check(
        "@at",
        ErrorKind::Instant,
        expect![[r#"
        error: `@at` needs an instant
          |
          | @at
          | ^^^
          = help: for example `@at 2027-01-15T09:30:00Z` or `@at 2027-01-15T09:30:00+01:00`
    "#]],
    );
    check(
        "@at tomorrow",
        ErrorKind::Instant,
        expect![[r#"
        error: `tomorrow` is not an RFC 3339 instant with its offset
          |
          | @at tomorrow
          |     ^^^^^^^^
          = help: for example `@at 2027-01-15T09:30:00Z` or `@at 2027-01-15T09:30:00+01:00`
    "#]],
    );
    check(
        "@at 2027-01-15T09:30:00",
        ErrorKind::Instant,
        expect![[r#"
        error: `2027-01-15T09:30:00` is not an RFC 3339 instant with its offset
          |
          | @at 2027-01-15T09:30:00
          |     ^^^^^^^^^^^^^^^^^^^
          = help: for example `@at 2027-01-15T09:30:00Z` or `@at 2027-01-15T09:30:00+01:00`
    "#]],
    );
    check(
        "@at 2027-01-15T09:30:00.5Z",
        ErrorKind::Instant,
        expect![[r#"
        error: `@at` fires on whole seconds; fractions of a second are not supported
          |
          | @at 2027-01-15T09:30:00.5Z
          |     ^^^^^^^^^^^^^^^^^^^^^^
          = help: drop the fraction of the second
    "#]],
    );
    check(
        "@every 500ms",
        ErrorKind::Duration,
        expect![[r#"
        error: `@every` fires on whole seconds; sub-second periods are not supported
          |
          | @every 500ms
          |        ^^^^^
          = help: use a period of at least `1s`
    "#]],
    );
    check(
        "@every 5x",
        ErrorKind::Duration,
        expect![[r#"
        error: unknown duration unit `x`
          |
          | @every 5x
          |         ^
          = help: write whole seconds or more with units d, h, m, s, such as `90s`, `5m` or `1h30m`
    "#]],
    );
    check(
        "@every 0s",
        ErrorKind::Duration,
        expect![[r#"
        error: the period must be at least one second
          |
          | @every 0s
          |        ^^
          = help: for example `@every 1s`
    "#]],
    );
}

#[test]
fn unknown_time_zones_get_a_suggestion() {
    check(
        "CRON_TZ=Europe/Berln 0 9 * * *",
        ErrorKind::TimeZone,
        expect![[r#"
        error: unknown time zone `Europe/Berln`
          |
          | CRON_TZ=Europe/Berln 0 9 * * *
          |         ^^^^^^^^^^^^
          = help: did you mean `Europe/Berlin`?
    "#]],
    );
    check(
        "TZ=Mars/Olympus 0 9 * * *",
        ErrorKind::TimeZone,
        expect![[r#"
        error: unknown time zone `Mars/Olympus`
          |
          | TZ=Mars/Olympus 0 9 * * *
          |    ^^^^^^^^^^^^
          = help: use an IANA zone name such as `Europe/Berlin`, `America/New_York` or `UTC`
    "#]],
    );
}

#[test]
fn every_error_points_inside_the_expression() {
    for expr in [
        "60 * * * *",
        "1,,2 * * * *",
        "* * * *",
        "0 0 * * MOM",
        "@every",
        "CRON_TZ= 1 * * * *",
        "0 0 1W-3 * *",
    ] {
        let err = Schedule::parse(expr).expect_err(expr);
        assert!(
            err.span.start <= err.span.end && err.span.end <= expr.len(),
            "{expr}: {:?}",
            err.span
        );
        assert!(!err.message.is_empty());
    }
}

/// A list of more than 65,535 items used to wrap the field positions and
/// panic while compiling (through the API, the request got no answer).
#[test]
fn regression_a_huge_list_is_refused_not_a_panic() {
    let list = (0..70_000)
        .map(|i| (i % 60).to_string())
        .collect::<Vec<_>>()
        .join(",");
    let err = Schedule::parse(&format!("{list} * * * *")).unwrap_err();
    assert_eq!(err.kind, ErrorKind::TooLong);
    assert!(err.message.contains("at most 1024"), "{}", err.message);
    // The longest useful expression, every value of every field listed, fits.
    let all = |n: u32| (0..n).map(|v| v.to_string()).collect::<Vec<_>>().join(",");
    let widest = format!("{} {} {} * * *", all(60), all(60), all(24));
    assert!(widest.len() <= dagcron_cron::MAX_EXPRESSION_LEN);
    Schedule::parse(&widest).unwrap();
}
