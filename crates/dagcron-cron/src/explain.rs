//! Plain-English explanations: "at 02:30 on the last weekday of every month,
//! in Europe/Berlin".

use crate::ast::{Field, FieldKind, Item, ItemKind, StepBase};
use crate::schedule::Schedule;

pub(crate) const MONTH_NAMES: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
pub(crate) const WEEKDAY_NAMES: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

pub(crate) fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, x) if x != 11 => "st",
        (2, x) if x != 12 => "nd",
        (3, x) if x != 13 => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// "a", "a and b", "a, b and c".
pub(crate) fn join(parts: &[String]) -> String {
    match parts {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

fn value_name(kind: FieldKind, v: u16) -> String {
    match kind {
        FieldKind::Month => MONTH_NAMES[usize::from(v) - 1].to_string(),
        FieldKind::DayOfWeek => WEEKDAY_NAMES[usize::from(v % 7)].to_string(),
        FieldKind::Hour => format!("{v:02}:00"),
        _ => v.to_string(),
    }
}

/// The noun of a field's unit, singular and plural.
fn unit(kind: FieldKind) -> (&'static str, &'static str) {
    match kind {
        FieldKind::Second => ("second", "seconds"),
        FieldKind::Minute => ("minute", "minutes"),
        FieldKind::Hour => ("hour", "hours"),
        FieldKind::DayOfMonth => ("day", "days"),
        FieldKind::Month => ("month", "months"),
        FieldKind::DayOfWeek => ("day of the week", "days of the week"),
        FieldKind::Year => ("year", "years"),
    }
}

fn every_n(kind: FieldKind, n: u32) -> String {
    let (one, many) = unit(kind);
    match (kind, n) {
        (_, 1) => format!("every {one}"),
        (FieldKind::DayOfMonth | FieldKind::Month | FieldKind::DayOfWeek | FieldKind::Year, _) => {
            format!("every {} {one}", ordinal(n))
        }
        _ => format!("every {n} {many}"),
    }
}

/// One list element, as a phrase.
fn item_phrase(kind: FieldKind, item: &Item) -> String {
    let name = |v| value_name(kind, v);
    let day_prefix = if kind == FieldKind::DayOfMonth {
        "day "
    } else {
        ""
    };
    match item.kind {
        ItemKind::Any | ItemKind::NoSpecific => every_n(kind, 1),
        ItemKind::Value(v) => format!("{day_prefix}{}", name(v)),
        ItemKind::Range(a, b) if kind == FieldKind::DayOfMonth => format!("days {a} through {b}"),
        ItemKind::Range(a, b) => format!("{} through {}", name(a), name(b)),
        ItemKind::Step { base, step } => {
            let (a, b) = match base {
                StepBase::Any => return every_n(kind, step),
                StepBase::From(a) => (a, kind.open_max().max(a)),
                StepBase::Range(a, b) => (a, b),
            };
            format!(
                "{} from {day_prefix}{} through {}",
                every_n(kind, step),
                name(a),
                name(b)
            )
        }
        ItemKind::Hash {
            hi,
            step: Some(s),
            start,
            ..
        } => format!(
            "{} from {day_prefix}{} through {} (hashed)",
            every_n(kind, s),
            name(start),
            name(hi)
        ),
        ItemKind::Hash { start, .. } => format!("{day_prefix}{} (hashed)", name(start)),
        ItemKind::LastDay(0) => "the last day".to_string(),
        ItemKind::LastDay(n) => format!(
            "{n} {} before the last day",
            if n == 1 { "day" } else { "days" }
        ),
        ItemKind::LastWeekday => "the last weekday".to_string(),
        ItemKind::NearestWeekday(n) => format!("the weekday nearest day {n}"),
        ItemKind::LastOfMonth(w) => format!("the last {}", WEEKDAY_NAMES[usize::from(w)]),
        ItemKind::Nth { weekday, nth } => {
            let nth_word = ["first", "second", "third", "fourth", "fifth"][usize::from(nth) - 1];
            format!("the {nth_word} {}", WEEKDAY_NAMES[usize::from(weekday)])
        }
    }
}

/// A field as a phrase ("day 30", "February", "Monday through Friday").
pub(crate) fn field_phrase(field: &Field<'_>) -> String {
    let parts: Vec<String> = field
        .items
        .iter()
        .map(|i| item_phrase(field.kind, i))
        .collect();
    join(&parts)
}

fn is_any(field: &Field<'_>) -> bool {
    field.is_any()
}

fn plain_values(field: &Field<'_>) -> Option<Vec<u16>> {
    field
        .items
        .iter()
        .map(|i| match i.kind {
            ItemKind::Value(v) => Some(v),
            ItemKind::Hash {
                step: None, start, ..
            } => Some(start),
            _ => None,
        })
        .collect()
}

fn time_phrase(sec: &Field<'_>, min: &Field<'_>, hour: &Field<'_>) -> String {
    if let (Some(s), Some(m), Some(h)) = (plain_values(sec), plain_values(min), plain_values(hour))
    {
        if s.len() * m.len() * h.len() <= 6 {
            let mut times = Vec::new();
            for hh in sorted(&h) {
                for mm in sorted(&m) {
                    for ss in sorted(&s) {
                        times.push(if s == [0] {
                            format!("{hh:02}:{mm:02}")
                        } else {
                            format!("{hh:02}:{mm:02}:{ss:02}")
                        });
                    }
                }
            }
            return format!("at {}", join(&times));
        }
    }
    let mut parts = Vec::new();
    let sec_zero = plain_values(sec).is_some_and(|v| v == [0]);
    if !sec_zero {
        parts.push(match plain_values(sec) {
            Some(v) => format!(
                "at second {}",
                join(&v.iter().map(u16::to_string).collect::<Vec<_>>())
            ),
            None => field_phrase(sec),
        });
    }
    if !is_any(min) || sec_zero {
        parts.push(match plain_values(min) {
            Some(v) if is_any(hour) => format!(
                "at minute {} of every hour",
                join(&v.iter().map(u16::to_string).collect::<Vec<_>>())
            ),
            Some(v) => format!(
                "at minute {}",
                join(&v.iter().map(u16::to_string).collect::<Vec<_>>())
            ),
            None => field_phrase(min),
        });
    }
    if !is_any(hour) {
        let phrases: Vec<String> = hour
            .items
            .iter()
            .map(|i| match i.kind {
                ItemKind::Value(h)
                | ItemKind::Hash {
                    step: None,
                    start: h,
                    ..
                } => format!("between {h:02}:00 and {h:02}:59"),
                ItemKind::Range(a, b) => format!("between {a:02}:00 and {b:02}:59"),
                _ => item_phrase(FieldKind::Hour, i),
            })
            .collect();
        parts.push(join(&phrases));
    }
    parts.join(", ")
}

fn sorted(v: &[u16]) -> Vec<u16> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

fn day_phrase(dom: &Field<'_>, month: &Field<'_>, dow: &Field<'_>, and_days: bool) -> String {
    let of_months = if is_any(month) {
        "of every month".to_string()
    } else {
        format!("of {}", field_phrase(month))
    };
    let in_months = if is_any(month) {
        String::new()
    } else {
        format!(" in {}", field_phrase(month))
    };
    let dow_phrase = || {
        let parts: Vec<String> = dow
            .items
            .iter()
            .map(|i| match i.kind {
                ItemKind::LastOfMonth(_) | ItemKind::Nth { .. } => {
                    format!("{} of the month", item_phrase(FieldKind::DayOfWeek, i))
                }
                _ => item_phrase(FieldKind::DayOfWeek, i),
            })
            .collect();
        join(&parts)
    };
    match (is_any(dom), is_any(dow)) {
        (true, true) if is_any(month) => "every day".to_string(),
        (true, true) => format!("every day{in_months}"),
        (false, true) => format!("on {} {of_months}", field_phrase(dom)),
        (true, false) => format!("on {}{in_months}", dow_phrase()),
        (false, false) if and_days => format!(
            "on {} {of_months} if it is {}",
            field_phrase(dom),
            dow_phrase()
        ),
        (false, false) => format!(
            "on {} {of_months} or on {}{in_months}",
            field_phrase(dom),
            dow_phrase()
        ),
    }
}

fn duration_phrase(secs: i64) -> String {
    let mut parts = Vec::new();
    let mut rest = secs;
    for (size, one, many) in [
        (86_400, "day", "days"),
        (3600, "hour", "hours"),
        (60, "minute", "minutes"),
        (1, "second", "seconds"),
    ] {
        let n = rest / size;
        rest %= size;
        if n > 0 {
            parts.push(format!("{n} {}", if n == 1 { one } else { many }));
        }
    }
    join(&parts)
}

/// The explanation of a schedule.
pub(crate) fn explain(schedule: &Schedule) -> String {
    let ast = schedule.ast();
    if let Some(at) = schedule.once() {
        let at = jiff::Timestamp::from_second(at).expect("a parsed instant");
        return format!("once, at {at}");
    }
    let mut out = if let Some(rule) = schedule.rule() {
        rule.explain()
    } else if let Some((period, anchor)) = schedule.every() {
        let mut s = if period == 1 {
            "every second".to_string()
        } else {
            format!("every {}", duration_phrase(period))
        };
        if anchor == 0 {
            s.push_str(", counted from the Unix epoch");
        } else if let Ok(t) = jiff::Timestamp::from_second(anchor) {
            s.push_str(&format!(", counted from {t}"));
        }
        s
    } else {
        let f = |k| ast.field(k).expect("cron fields");
        let compiled = schedule.compiled().expect("cron fields");
        let time = time_phrase(
            &f(FieldKind::Second),
            &f(FieldKind::Minute),
            &f(FieldKind::Hour),
        );
        let day = day_phrase(
            &f(FieldKind::DayOfMonth),
            &f(FieldKind::Month),
            &f(FieldKind::DayOfWeek),
            compiled.and_days,
        );
        // "at 02:30" reads well before any day phrase; rhythms take a comma.
        let at_times = time
            .strip_prefix("at ")
            .is_some_and(|t| t.starts_with(|c: char| c.is_ascii_digit()));
        let mut s = match (at_times, day.as_str()) {
            (false, "every day") => time,
            (true, _) => format!("{time} {day}"),
            (false, _) => format!("{time}, {day}"),
        };
        let year = f(FieldKind::Year);
        if !is_any(&year) {
            s.push_str(&format!(", in {}", field_phrase(&year)));
        }
        s
    };
    let tz = schedule.time_zone();
    match tz.iana_name() {
        Some("UTC") => {}
        Some(name) => out.push_str(&format!(", in {name}")),
        None => match tz.to_fixed_offset() {
            Ok(o) if o.seconds() == 0 => {}
            Ok(o) => out.push_str(&format!(", at UTC{o}")),
            Err(_) => {}
        },
    }
    out
}
