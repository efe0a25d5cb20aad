//! Exclusion calendars: named sets of instants (absolute ranges, yearly
//! dates, weekly windows, cron expressions, each read in the calendar's time
//! zone) during which a job's fires are suppressed. Declared beside the jobs
//! of a file and resolved into each job that lists them, so a job carries its
//! exclusions and a change of a calendar is a new version of its jobs. The
//! decision "is instant t excluded, and by which calendar" takes the instant
//! as an argument.

use dagcron_cron::{Options, Schedule, Timetable};
use jiff::Timestamp;
use jiff::civil::{Date, DateTime, Time};
use jiff::tz::TimeZone;
use serde::{Deserialize, Serialize};

use crate::model::ValidationError;

/// The most entries of each kind (dates, ranges, windows, expressions) in
/// one calendar, and the most calendars one job may exclude: every fire
/// asks each of them.
pub const MAX_CALENDAR_ENTRIES: usize = 366;

/// A calendar as declared in a job file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalendarSpec {
    /// Unique within the file; what jobs list in `exclude`.
    pub name: String,
    /// The IANA zone its dates, windows and expressions are read in.
    #[serde(default = "utc")]
    pub timezone: String,
    /// Whole days every year, `MM-DD`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dates: Vec<String>,
    /// Absolute ranges `[from, to)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranges: Vec<RangeSpec>,
    /// Windows of the week, in wall-clock time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weekly: Vec<WeeklySpec>,
    /// Cron expressions: each excludes the minute (or, with a seconds
    /// field, the second) it matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cron: Vec<String>,
}

fn utc() -> String {
    "UTC".into()
}

/// An absolute range, `[from, to)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RangeSpec {
    /// RFC 3339, or a civil date-time read in the calendar's zone.
    pub from: String,
    /// The same; the range ends just before it.
    pub to: String,
}

/// A weekly window, `[from, to)` in wall-clock time on each of `days`; a
/// window whose `to` is not after its `from` ends on the next day.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeeklySpec {
    /// `SUN`..`SAT`, any case.
    pub days: Vec<String>,
    /// `HH:MM` or `HH:MM:SS`.
    pub from: String,
    /// `HH:MM`, `HH:MM:SS` or `24:00`.
    pub to: String,
}

/// A calendar compiled: what a scheduler asks at each fire.
#[derive(Clone, Debug)]
pub struct Calendar {
    /// Its name, recorded with the fires it suppresses.
    pub name: Box<str>,
    tz: TimeZone,
    /// (month, day) pairs.
    dates: Box<[(i8, i8)]>,
    ranges: Box<[(Timestamp, Timestamp)]>,
    weekly: Box<[Window]>,
    /// Each timetable with the length of what it matches, in seconds.
    cron: Box<[(Timetable, i64)]>,
}

#[derive(Clone, Copy, Debug)]
struct Window {
    /// Bit n: weekday n, 0 = Sunday.
    days: u8,
    /// Seconds of the day.
    from: i32,
    /// Seconds of the day, up to 86,400; at or before `from`: next day.
    to: i32,
}

impl Window {
    fn contains(&self, weekday: u8, second: i32) -> bool {
        let on = |d: u8| self.days & (1 << d) != 0;
        if self.from < self.to {
            on(weekday) && self.from <= second && second < self.to
        } else {
            (on(weekday) && second >= self.from) || (on((weekday + 6) % 7) && second < self.to)
        }
    }
}

impl Calendar {
    /// Whether `t` is excluded.
    pub fn excludes(&self, t: Timestamp) -> bool {
        if self.ranges.iter().any(|(from, to)| *from <= t && t < *to) {
            return true;
        }
        if !self.dates.is_empty() || !self.weekly.is_empty() {
            let civil = self.tz.to_datetime(t);
            if self
                .dates
                .iter()
                .any(|(m, d)| civil.month() == *m && civil.day() == *d)
            {
                return true;
            }
            let weekday = civil.weekday().to_sunday_zero_offset() as u8;
            let second = i32::from(civil.hour()) * 3600
                + i32::from(civil.minute()) * 60
                + i32::from(civil.second());
            if self.weekly.iter().any(|w| w.contains(weekday, second)) {
                return true;
            }
        }
        self.cron.iter().any(|(table, unit)| {
            let start = t.as_second().div_euclid(*unit) * unit;
            Timestamp::from_second(start).is_ok_and(|s| table.matches(s))
        })
    }

    /// Compiles `spec`, reporting every problem with a path under `at`.
    pub fn compile(spec: &CalendarSpec, at: &str) -> Result<Calendar, Vec<ValidationError>> {
        let mut errors = Vec::new();
        let mut err = |path: String, message: String| {
            errors.push(ValidationError {
                path,
                message,
                span: None,
            })
        };
        if !crate::model::valid_name(&spec.name) {
            err(
                format!("{at}.name"),
                format!(
                    "invalid calendar name {:?}: use 1-63 lowercase letters, digits, '-', '_' or '.', starting with a letter or digit",
                    spec.name
                ),
            );
        }
        let tz = match TimeZone::get(&spec.timezone) {
            Ok(tz) => tz,
            Err(_) => {
                err(
                    format!("{at}.timezone"),
                    format!(
                        "unknown time zone {:?}: use an IANA name such as Europe/Berlin",
                        spec.timezone
                    ),
                );
                TimeZone::UTC
            }
        };
        for (field, n) in [
            ("dates", spec.dates.len()),
            ("ranges", spec.ranges.len()),
            ("weekly", spec.weekly.len()),
            ("cron", spec.cron.len()),
        ] {
            if n > MAX_CALENDAR_ENTRIES {
                err(
                    format!("{at}.{field}"),
                    format!(
                        "{n} entries; a calendar has at most {MAX_CALENDAR_ENTRIES} of each kind"
                    ),
                );
            }
        }
        if spec.dates.is_empty()
            && spec.ranges.is_empty()
            && spec.weekly.is_empty()
            && spec.cron.is_empty()
        {
            err(
                at.to_string(),
                "an empty calendar excludes nothing: give it `dates`, `ranges`, `weekly` or `cron`"
                    .into(),
            );
        }
        let mut dates = Vec::new();
        for (k, text) in spec.dates.iter().enumerate() {
            match yearly_date(text) {
                Ok(d) => dates.push(d),
                Err(m) => err(format!("{at}.dates[{k}]"), m),
            }
        }
        let mut ranges = Vec::new();
        for (k, r) in spec.ranges.iter().enumerate() {
            let from = instant(&r.from, &tz).map_err(|m| err(format!("{at}.ranges[{k}].from"), m));
            let to = instant(&r.to, &tz).map_err(|m| err(format!("{at}.ranges[{k}].to"), m));
            if let (Ok(from), Ok(to)) = (from, to) {
                if to <= from {
                    err(
                        format!("{at}.ranges[{k}].to"),
                        format!("the range ends ({to}) before it starts ({from})"),
                    );
                } else {
                    ranges.push((from, to));
                }
            }
        }
        let mut weekly = Vec::new();
        for (k, w) in spec.weekly.iter().enumerate() {
            let mut days = 0u8;
            if w.days.is_empty() {
                err(
                    format!("{at}.weekly[{k}].days"),
                    "no days: list some of SUN, MON, TUE, WED, THU, FRI, SAT".into(),
                );
            }
            for (d, name) in w.days.iter().enumerate() {
                match weekday(name) {
                    Some(n) => days |= 1 << n,
                    None => err(
                        format!("{at}.weekly[{k}].days[{d}]"),
                        format!("unknown day {name:?}: use SUN, MON, TUE, WED, THU, FRI or SAT"),
                    ),
                }
            }
            let from =
                time_of_day(&w.from, false).map_err(|m| err(format!("{at}.weekly[{k}].from"), m));
            let to = time_of_day(&w.to, true).map_err(|m| err(format!("{at}.weekly[{k}].to"), m));
            if let (Ok(from), Ok(to)) = (from, to) {
                if from == to {
                    err(
                        format!("{at}.weekly[{k}].to"),
                        "the window is empty: `to` equals `from`".into(),
                    );
                } else {
                    weekly.push(Window { days, from, to });
                }
            }
        }
        let mut cron = Vec::new();
        let mut cron_errors = Vec::new();
        let options = Options {
            time_zone: tz.clone(),
            hash_seed: dagcron_cron::seed_from_key(&spec.name),
            ..Options::default()
        };
        for (k, expr) in spec.cron.iter().enumerate() {
            match Schedule::parse_with(expr, &options) {
                Ok(s) => {
                    if s.ast().is_rule() {
                        cron_errors.push(ValidationError {
                            path: format!("{at}.cron[{k}]"),
                            message: format!("{expr:?}: a recurrence rule names instants, not periods to exclude; use `dates`, `ranges`, `weekly` or a cron expression"),
                            span: None,
                        });
                        continue;
                    }
                    if s.ast().every_seconds().is_some() {
                        cron_errors.push(ValidationError {
                            path: format!("{at}.cron[{k}]"),
                            message: format!("{expr:?}: `@every` names instants, not periods to exclude; use a cron expression or a weekly window"),
                            span: None,
                        });
                        continue;
                    }
                    // Five fields (or a descriptor) name minutes; with a
                    // seconds field, seconds.
                    let unit = if s.ast().field_count().is_some_and(|n| n >= 6) {
                        1
                    } else {
                        60
                    };
                    cron.push((s.timetable().clone(), unit));
                }
                Err(e) => {
                    let mut message = format!("invalid cron expression {expr:?}: {}", e.message);
                    if let Some(help) = &e.suggestion {
                        message.push_str(&format!(" ({help})"));
                    }
                    cron_errors.push(ValidationError {
                        path: format!("{at}.cron[{k}]"),
                        message,
                        span: Some((e.span.start, e.span.end)),
                    });
                }
            }
        }
        errors.extend(cron_errors);
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Calendar {
            name: spec.name.as_str().into(),
            tz,
            dates: dates.into(),
            ranges: ranges.into(),
            weekly: weekly.into(),
            cron: cron.into(),
        })
    }
}

/// `MM-DD`, a day that exists in some year (`02-29` in leap years only).
fn yearly_date(text: &str) -> Result<(i8, i8), String> {
    let bad = || {
        format!("invalid date {text:?}: use MM-DD, such as \"12-25\" (every year, the whole day)")
    };
    let (m, d) = text.split_once('-').ok_or_else(bad)?;
    if m.len() != 2 || d.len() != 2 {
        return Err(bad());
    }
    let m: i8 = m.parse().map_err(|_| bad())?;
    let d: i8 = d.parse().map_err(|_| bad())?;
    // 2024 is a leap year: every MM-DD that exists in some year exists in it.
    Date::new(2024, m, d).map_err(|_| format!("{text:?} is not a day of any year"))?;
    Ok((m, d))
}

/// An RFC 3339 instant, or a civil date-time in `tz` (the earlier of two
/// in a fold, the instant after a gap).
fn instant(text: &str, tz: &TimeZone) -> Result<Timestamp, String> {
    if let Ok(t) = text.parse::<Timestamp>() {
        return Ok(t);
    }
    let civil: DateTime = text.parse().map_err(|_| {
        format!("invalid instant {text:?}: use RFC 3339 (\"2026-12-24T00:00:00Z\") or a date-time in the calendar's zone (\"2026-12-24T00:00:00\")")
    })?;
    tz.to_ambiguous_timestamp(civil)
        .compatible()
        .map_err(|e| format!("{text:?}: {e}"))
}

/// `HH:MM` or `HH:MM:SS` as seconds of the day; `24:00` too if `end`.
fn time_of_day(text: &str, end: bool) -> Result<i32, String> {
    if end && (text == "24:00" || text == "24:00:00") {
        return Ok(86_400);
    }
    let bad = || {
        format!(
            "invalid time {text:?}: use HH:MM or HH:MM:SS, such as \"02:00\"{}",
            if end { " (or 24:00)" } else { "" }
        )
    };
    let parts: Vec<&str> = text.split(':').collect();
    if !(parts.len() == 2 || parts.len() == 3) || parts.iter().any(|p| p.len() != 2) {
        return Err(bad());
    }
    let n: Vec<i8> = parts
        .iter()
        .map(|p| p.parse::<i8>().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let t = Time::new(n[0], n[1], n.get(2).copied().unwrap_or(0), 0).map_err(|_| bad())?;
    Ok(i32::from(t.hour()) * 3600 + i32::from(t.minute()) * 60 + i32::from(t.second()))
}

fn weekday(name: &str) -> Option<u8> {
    const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
    DAYS.iter()
        .position(|d| d.eq_ignore_ascii_case(name))
        .map(|n| n as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cal(yaml: &str) -> Calendar {
        let spec: CalendarSpec = serde_saphyr::from_str(yaml).unwrap();
        Calendar::compile(&spec, "calendars[0]").unwrap_or_else(|e| panic!("{e:?}"))
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// Which of the instants from `from`, every `step` minutes, `n` of
    /// them, the calendar excludes, as UTC times.
    fn excluded(c: &Calendar, from: &str, step: i64, n: i64) -> Vec<String> {
        (0..n)
            .map(|i| at(from) + jiff::SignedDuration::from_mins(i * step))
            .filter(|t| c.excludes(*t))
            .map(|t| t.to_string())
            .collect()
    }

    #[test]
    fn a_weekly_window_over_the_spring_forward_night_in_berlin() {
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST. The window 02:00-04:00
        // is wall-clock time, so it lasts one real hour that night:
        // 01:00Z (03:00 CEST) to 02:00Z (04:00 CEST).
        let c = cal(
            "name: m\ntimezone: Europe/Berlin\nweekly: [{ days: [SUN], from: '02:00', to: '04:00' }]\n",
        );
        expect_test::expect![[r#"
            [
                "2026-03-29T01:00:00Z",
                "2026-03-29T01:30:00Z",
            ]
        "#]]
        .assert_debug_eq(&excluded(&c, "2026-03-28T23:00:00Z", 30, 8));
    }

    #[test]
    fn a_weekly_window_over_the_fall_back_night_in_berlin() {
        // 2026-10-25: 03:00 CEST falls back to 02:00 CET. 02:00-04:00 local
        // happens from 00:00Z to 03:00Z: both 02:xx hours are in it.
        let c = cal(
            "name: m\ntimezone: Europe/Berlin\nweekly: [{ days: [sun], from: '02:00', to: '04:00' }]\n",
        );
        expect_test::expect![[r#"
            [
                "2026-10-25T00:00:00Z",
                "2026-10-25T00:30:00Z",
                "2026-10-25T01:00:00Z",
                "2026-10-25T01:30:00Z",
                "2026-10-25T02:00:00Z",
                "2026-10-25T02:30:00Z",
            ]
        "#]]
        .assert_debug_eq(&excluded(&c, "2026-10-24T23:00:00Z", 30, 10));
    }

    #[test]
    fn a_window_that_ends_after_midnight_belongs_to_its_first_day() {
        let c = cal("name: m\nweekly: [{ days: [FRI], from: '22:00', to: '02:00' }]\n");
        // 2026-12-04 is a Friday.
        assert!(c.excludes(at("2026-12-04T22:00:00Z")));
        assert!(c.excludes(at("2026-12-05T01:59:59Z")), "Saturday early");
        assert!(!c.excludes(at("2026-12-05T02:00:00Z")));
        assert!(!c.excludes(at("2026-12-04T01:00:00Z")), "Friday early");
        assert!(!c.excludes(at("2026-12-05T22:00:00Z")), "Saturday late");
    }

    #[test]
    fn yearly_dates_are_whole_local_days_in_every_year() {
        let c = cal("name: h\ntimezone: Europe/Berlin\ndates: ['12-25', '01-01', '02-29']\n");
        for year in [2026, 2027, 2031, 2099] {
            // Christmas in Berlin starts at 23:00Z the day before.
            assert!(c.excludes(at(&format!("{}-12-24T23:00:00Z", year))));
            assert!(c.excludes(at(&format!("{year}-12-25T22:59:59Z"))));
            assert!(!c.excludes(at(&format!("{year}-12-25T23:00:00Z"))));
            assert!(!c.excludes(at(&format!("{year}-12-24T22:59:59Z"))));
            assert!(c.excludes(at(&format!("{}-12-31T23:30:00Z", year - 1))));
        }
        assert!(c.excludes(at("2028-02-29T12:00:00Z")), "a leap day");
        assert!(!c.excludes(at("2027-03-01T12:00:00Z")));
    }

    #[test]
    fn ranges_are_half_open_and_may_be_civil_in_the_zone() {
        let c = cal(
            "name: r\ntimezone: Asia/Shanghai\nranges: [{ from: '2026-12-24T00:00:00Z', to: '2026-12-25T00:00:00Z' }, { from: '2027-01-01T00:00:00', to: '2027-01-02T00:00:00' }]\n",
        );
        assert!(c.excludes(at("2026-12-24T00:00:00Z")));
        assert!(!c.excludes(at("2026-12-25T00:00:00Z")));
        assert!(
            c.excludes(at("2026-12-31T16:00:00Z")),
            "midnight in Shanghai"
        );
        assert!(!c.excludes(at("2026-12-31T15:59:59Z")));
    }

    #[test]
    fn a_cron_expression_excludes_the_minutes_it_names() {
        let c = cal("name: m\ncron: ['* 3 1 * *']\n");
        assert!(c.excludes(at("2026-12-01T03:00:00Z")));
        assert!(c.excludes(at("2026-12-01T03:59:30Z")), "within the minute");
        assert!(!c.excludes(at("2026-12-01T04:00:00Z")));
        assert!(!c.excludes(at("2026-12-02T03:00:00Z")));
        let s = cal("name: s\ncron: ['*/10 * * * * *']\n");
        assert!(s.excludes(at("2026-12-01T03:00:10.5Z")));
        assert!(!s.excludes(at("2026-12-01T03:00:11Z")));
    }

    #[test]
    fn malformed_entries_are_reported_with_their_paths() {
        let spec: CalendarSpec = serde_saphyr::from_str(
            "name: Bad\ntimezone: Mars/Olympus\ndates: ['12-32', '2-1', '02-30']\nranges: [{ from: yesterday, to: '2026-01-01T00:00:00Z' }, { from: '2026-01-02T00:00:00Z', to: '2026-01-01T00:00:00Z' }]\nweekly: [{ days: [SUNDAY], from: '25:00', to: '04:00' }, { days: [], from: '02:00', to: '02:00' }]\ncron: ['61 * * * *', '@every 1h', 'RRULE:FREQ=DAILY']\n",
        )
        .unwrap();
        let errors = Calendar::compile(&spec, "calendars[0]").unwrap_err();
        let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        expect_test::expect![[r#"
            [
                "calendars[0].name: invalid calendar name \"Bad\": use 1-63 lowercase letters, digits, '-', '_' or '.', starting with a letter or digit",
                "calendars[0].timezone: unknown time zone \"Mars/Olympus\": use an IANA name such as Europe/Berlin",
                "calendars[0].dates[0]: \"12-32\" is not a day of any year",
                "calendars[0].dates[1]: invalid date \"2-1\": use MM-DD, such as \"12-25\" (every year, the whole day)",
                "calendars[0].dates[2]: \"02-30\" is not a day of any year",
                "calendars[0].ranges[0].from: invalid instant \"yesterday\": use RFC 3339 (\"2026-12-24T00:00:00Z\") or a date-time in the calendar's zone (\"2026-12-24T00:00:00\")",
                "calendars[0].ranges[1].to: the range ends (2026-01-01T00:00:00Z) before it starts (2026-01-02T00:00:00Z)",
                "calendars[0].weekly[0].days[0]: unknown day \"SUNDAY\": use SUN, MON, TUE, WED, THU, FRI or SAT",
                "calendars[0].weekly[0].from: invalid time \"25:00\": use HH:MM or HH:MM:SS, such as \"02:00\"",
                "calendars[0].weekly[1].days: no days: list some of SUN, MON, TUE, WED, THU, FRI, SAT",
                "calendars[0].weekly[1].to: the window is empty: `to` equals `from`",
                "calendars[0].cron[0]: invalid cron expression \"61 * * * *\": 61 is out of range for the minute field (accepted: 0-59)",
                "calendars[0].cron[1]: \"@every 1h\": `@every` names instants, not periods to exclude; use a cron expression or a weekly window",
                "calendars[0].cron[2]: \"RRULE:FREQ=DAILY\": a recurrence rule names instants, not periods to exclude; use `dates`, `ranges`, `weekly` or a cron expression",
            ]
        "#]]
        .assert_debug_eq(&text);
    }
}
