//! An independent, deliberately naive evaluator used as a test oracle.
//!
//! It reads the syntax tree and decides, for one instant, whether the
//! schedule fires then. It shares nothing with the engine's search: no bit
//! sets, no civil-second arithmetic, no segments; dates come from jiff and
//! each item is interpreted from its definition in SPEC.md.

use dagcron_cron::{DstGap, DstOverlap, Field, FieldKind, ItemKind, Schedule, StepBase};
use jiff::civil::{Date, DateTime, Weekday};
use jiff::tz::AmbiguousOffset;
use jiff::{SignedDuration, Timestamp};

fn weekday_num(d: Date) -> i64 {
    match d.weekday() {
        Weekday::Sunday => 0,
        w => i64::from(w.to_monday_one_offset()),
    }
}

/// Whether `v` is one of the field's values, weekdays counted modulo 7.
fn in_values(kind: FieldKind, lo: u16, hi: u16, step: u32, v: i64) -> bool {
    let mut x = u64::from(lo);
    while x <= u64::from(hi) {
        let val = if kind == FieldKind::DayOfWeek {
            (x % 7) as i64
        } else {
            x as i64
        };
        if val == v {
            return true;
        }
        x += u64::from(step);
    }
    false
}

fn item_matches(kind: FieldKind, item: ItemKind, v: i64, date: Date) -> bool {
    let open_max = if kind == FieldKind::DayOfWeek {
        6
    } else {
        kind.max()
    };
    let last = i64::from(date.days_in_month());
    match item {
        ItemKind::Any | ItemKind::NoSpecific => true,
        ItemKind::Value(x) => in_values(kind, x, x, 1, v),
        ItemKind::Range(a, b) => in_values(kind, a, b, 1, v),
        ItemKind::Step {
            base: StepBase::Any,
            step,
        } => in_values(kind, kind.min(), open_max, step, v),
        ItemKind::Step {
            base: StepBase::From(a),
            step,
        } => in_values(kind, a, open_max.max(a), step, v),
        ItemKind::Step {
            base: StepBase::Range(a, b),
            step,
        } => in_values(kind, a, b, step, v),
        ItemKind::Hash {
            step: None, start, ..
        } => in_values(kind, start, start, 1, v),
        ItemKind::Hash {
            step: Some(s),
            start,
            hi,
            ..
        } => in_values(kind, start, hi, s, v),
        ItemKind::LastDay(n) => i64::from(date.day()) == last - i64::from(n),
        ItemKind::LastWeekday => {
            let mut d = date.last_of_month();
            while matches!(d.weekday(), Weekday::Saturday | Weekday::Sunday) {
                d = d.yesterday().unwrap();
            }
            d == date
        }
        ItemKind::NearestWeekday(n) => {
            let Ok(target) = Date::new(date.year(), date.month(), n as i8) else {
                return false;
            };
            let moved = match target.weekday() {
                Weekday::Saturday if n == 1 => {
                    target.checked_add(SignedDuration::from_hours(48)).unwrap()
                }
                Weekday::Saturday => target.yesterday().unwrap(),
                Weekday::Sunday if i64::from(n) == last => {
                    target.checked_sub(SignedDuration::from_hours(48)).unwrap()
                }
                Weekday::Sunday => target.tomorrow().unwrap(),
                _ => target,
            };
            moved == date
        }
        ItemKind::LastOfMonth(w) => {
            weekday_num(date) == i64::from(w) && i64::from(date.day()) + 7 > last
        }
        ItemKind::Nth { weekday, nth } => {
            weekday_num(date) == i64::from(weekday)
                && (i64::from(date.day()) - 1) / 7 + 1 == i64::from(nth)
        }
    }
}

fn field_matches(field: &Field<'_>, v: i64, date: Date) -> bool {
    field
        .items
        .iter()
        .any(|i| item_matches(field.kind, i.kind, v, date))
}

/// Whether a civil date-time matches the expression's fields.
pub(crate) fn civil_matches(s: &Schedule, dt: DateTime) -> bool {
    let ast = s.ast();
    let f = |k| ast.field(k).unwrap();
    let date = dt.date();
    let (dom, dow) = (f(FieldKind::DayOfMonth), f(FieldKind::DayOfWeek));
    let dom_ok = field_matches(&dom, i64::from(date.day()), date);
    let dow_ok = field_matches(&dow, weekday_num(date), date);
    let day_ok = if dom.is_star() || dow.is_star() {
        dom_ok && dow_ok
    } else {
        dom_ok || dow_ok
    };
    day_ok
        && field_matches(&f(FieldKind::Year), i64::from(date.year()), date)
        && field_matches(&f(FieldKind::Month), i64::from(date.month()), date)
        && field_matches(&f(FieldKind::Hour), i64::from(dt.hour()), date)
        && field_matches(&f(FieldKind::Minute), i64::from(dt.minute()), date)
        && field_matches(&f(FieldKind::Second), i64::from(dt.second()), date)
}

/// Whether the schedule fires at the whole second `t`, applying the DST
/// policies from their definitions.
pub(crate) fn fires_at(s: &Schedule, t: Timestamp) -> bool {
    let tz = s.time_zone();
    let offset = tz.to_offset(t);
    let dt = tz.to_datetime(t);
    let occurrence_ok = match tz.to_ambiguous_timestamp(dt).offset() {
        AmbiguousOffset::Fold { before, after } if before != after => {
            if offset == before {
                s.dst_overlap() != DstOverlap::Last
            } else {
                s.dst_overlap() != DstOverlap::First
            }
        }
        _ => true,
    };
    if occurrence_ok && civil_matches(s, dt) {
        return true;
    }
    // The first instant after a gap fires for the skipped local times.
    if s.dst_gap() == DstGap::Shift {
        let before = t.checked_sub(SignedDuration::from_secs(1)).unwrap();
        let prev_offset = tz.to_offset(before);
        if prev_offset < offset {
            let gap = i64::from(offset.seconds() - prev_offset.seconds());
            let first_skipped = tz
                .to_datetime(before)
                .checked_add(SignedDuration::from_secs(1))
                .unwrap();
            return (0..gap).any(|k| {
                civil_matches(
                    s,
                    first_skipped
                        .checked_add(SignedDuration::from_secs(k))
                        .unwrap(),
                )
            });
        }
    }
    false
}

/// Every fire in `(from, from + window]`, by checking each second.
pub(crate) fn fires_in(s: &Schedule, from: Timestamp, window_secs: i64) -> Vec<Timestamp> {
    (1..=window_secs)
        .map(|k| Timestamp::from_second(from.as_second() + k).unwrap())
        .filter(|t| fires_at(s, *t))
        .collect()
}
