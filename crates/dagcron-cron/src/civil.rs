//! The compiled form of a cron expression and the search over civil time.
//!
//! Each field becomes a bit set; the search moves field by field (year,
//! month, day, hour, minute, second), jumping to the next set bit with one
//! `trailing_zeros`, so it never steps through time one unit at a time.
//! Every loop advances at least one field, and the year is bounded, so the
//! search always ends.

use crate::ast::{Ast, FieldKind, ItemKind, StepBase};
use crate::calendar::{Civil, DAY, days_from_civil, days_in_month, weekday};
use crate::error::{ErrorKind, ParseError};

/// The last year the search looks at (the end of the supported timeline).
pub(crate) const MAX_YEAR: i32 = 9999;
/// The first year the search looks at.
pub(crate) const MIN_YEAR: i32 = -9999;
const YEAR_BASE: i32 = 1970;

/// Outcome of a bounded search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Search {
    /// A matching civil second within the bound.
    Found(i64),
    /// The first match lies beyond the bound.
    Beyond,
    /// Nothing matches in that direction, ever.
    Exhausted,
}

/// A set of civil seconds the zone walker can search: a compiled cron
/// expression or a recurrence rule.
pub(crate) trait CivilSet {
    /// The first member in `[from, limit)`.
    fn next(&self, from: i64, limit: i64) -> Search;
    /// The last member in `[limit, from]`.
    fn prev(&self, from: i64, limit: i64) -> Search;
    /// Whether `secs` is a member.
    fn matches_civil(&self, secs: i64) -> bool;
}

impl CivilSet for Compiled {
    fn next(&self, from: i64, limit: i64) -> Search {
        Compiled::next(self, from, limit)
    }
    fn prev(&self, from: i64, limit: i64) -> Search {
        Compiled::prev(self, from, limit)
    }
    fn matches_civil(&self, secs: i64) -> bool {
        Compiled::matches_civil(self, secs)
    }
}

/// Years 1970-2099 as a bit set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct YearSet([u64; 3]);

impl YearSet {
    fn insert(&mut self, year: u16) {
        let i = usize::from(year) - YEAR_BASE as usize;
        self.0[i / 64] |= 1 << (i % 64);
    }

    fn contains(&self, year: i32) -> bool {
        let i = year - YEAR_BASE;
        (0..192).contains(&i) && self.0[i as usize / 64] & (1 << (i % 64)) != 0
    }

    /// The first year in the set at or after `year`.
    fn next(&self, year: i32) -> Option<i32> {
        let from = (year - YEAR_BASE).max(0);
        (from..192)
            .find(|i| self.0[*i as usize / 64] & (1 << (i % 64)) != 0)
            .map(|i| i + YEAR_BASE)
    }

    /// The last year in the set at or before `year`.
    fn prev(&self, year: i32) -> Option<i32> {
        let to = (year - YEAR_BASE).min(191);
        (0..=to)
            .rev()
            .find(|i| self.0[*i as usize / 64] & (1 << (i % 64)) != 0)
            .map(|i| i + YEAR_BASE)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = i32> + '_ {
        (0..192)
            .filter(|i| self.0[i / 64] & (1 << (i % 64)) != 0)
            .map(|i| i as i32 + YEAR_BASE)
    }
}

/// A cron expression compiled to bit sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Compiled {
    pub(crate) seconds: u64,
    pub(crate) minutes: u64,
    pub(crate) hours: u64,
    /// Plain days of the month, bits 1..=31 (all of them for `*`).
    pub(crate) dom: u32,
    /// `L-n`: bit n (bit 0 is `L`).
    pub(crate) dom_last: u32,
    /// `nW`: bit n.
    pub(crate) dom_nearest: u32,
    /// `LW`.
    pub(crate) dom_last_weekday: bool,
    /// Plain weekdays, bits 0..=6 (Sunday is 0).
    pub(crate) dow: u8,
    /// `n#k`: per weekday, bit k.
    pub(crate) dow_nth: [u8; 7],
    /// `nL`: bit n.
    pub(crate) dow_last: u8,
    /// Months, bits 1..=12.
    pub(crate) months: u64,
    /// `None` when every year matches.
    pub(crate) years: Option<YearSet>,
    /// Vixie cron's rule: when either day field starts with `*` (or is `?`)
    /// a day must match both; otherwise either.
    pub(crate) and_days: bool,
    has_dom_specials: bool,
    has_dow_specials: bool,
    /// Every day of every month matches: the day mask is just the month's length.
    every_day: bool,
}

fn span_bits(lo: u16, hi: u16, step: u32) -> u64 {
    if step == 1 {
        // All bits from lo through hi (hi is at most 59).
        return (u64::MAX >> (63 - hi)) & (u64::MAX << lo);
    }
    let mut bits = 0u64;
    let mut v = u64::from(lo);
    while v <= u64::from(hi) {
        bits |= 1 << v;
        v += u64::from(step);
    }
    bits
}

/// The bits of one field (for the year, relative to 1970 in `years`).
fn field_bits(ast: &Ast, kind: FieldKind, years: &mut YearSet) -> (u64, bool) {
    let field = ast.field(kind).expect("cron fields");
    let (min, max, open) = (kind.min(), kind.max(), kind.open_max());
    let mut bits = 0u64;
    let mut any = false;
    let mut add = |lo: u16, hi: u16, step: u32, bits: &mut u64| {
        if kind == FieldKind::Year {
            let mut v = u64::from(lo);
            while v <= u64::from(hi) {
                years.insert(v as u16);
                v += u64::from(step);
            }
        } else {
            *bits |= span_bits(lo, hi, step);
        }
    };
    for item in field.items {
        match item.kind {
            ItemKind::Any | ItemKind::NoSpecific => {
                any = true;
                if kind != FieldKind::Year {
                    add(min, open, 1, &mut bits);
                }
            }
            ItemKind::Value(v) => add(v, v, 1, &mut bits),
            ItemKind::Range(a, b) => add(a, b, 1, &mut bits),
            ItemKind::Step { base, step } => {
                let (a, b) = match base {
                    StepBase::Any => (min, open),
                    StepBase::From(a) => (a, open.max(a)),
                    StepBase::Range(a, b) => (a, b),
                };
                add(a, b, step, &mut bits);
            }
            ItemKind::Hash {
                hi, step, start, ..
            } => match step {
                None => add(start, start, 1, &mut bits),
                Some(s) => add(start, hi, s, &mut bits),
            },
            // Specials are compiled by the caller.
            _ => {}
        }
    }
    if kind == FieldKind::DayOfWeek && bits & (1 << 7) != 0 {
        bits = (bits & 0x7f) | 1;
    }
    let _ = max;
    (bits, any)
}

impl Compiled {
    pub(crate) fn new(ast: &Ast) -> Result<Compiled, ParseError> {
        let mut years = YearSet([0; 3]);
        let (seconds, _) = field_bits(ast, FieldKind::Second, &mut years);
        let (minutes, _) = field_bits(ast, FieldKind::Minute, &mut years);
        let (hours, _) = field_bits(ast, FieldKind::Hour, &mut years);
        let (dom, _) = field_bits(ast, FieldKind::DayOfMonth, &mut years);
        let (months, _) = field_bits(ast, FieldKind::Month, &mut years);
        let (dow, _) = field_bits(ast, FieldKind::DayOfWeek, &mut years);
        let (_, any_year) = field_bits(ast, FieldKind::Year, &mut years);
        let mut c = Compiled {
            seconds,
            minutes,
            hours,
            dom: dom as u32,
            dom_last: 0,
            dom_nearest: 0,
            dom_last_weekday: false,
            dow: dow as u8,
            dow_nth: [0; 7],
            dow_last: 0,
            months,
            years: (!any_year).then_some(years),
            and_days: false,
            has_dom_specials: false,
            has_dow_specials: false,
            every_day: false,
        };
        let dom_field = ast.field(FieldKind::DayOfMonth).expect("cron fields");
        let dow_field = ast.field(FieldKind::DayOfWeek).expect("cron fields");
        for item in dom_field.items {
            match item.kind {
                ItemKind::LastDay(n) => c.dom_last |= 1 << n,
                ItemKind::NearestWeekday(n) => c.dom_nearest |= 1 << n,
                ItemKind::LastWeekday => c.dom_last_weekday = true,
                _ => {}
            }
        }
        for item in dow_field.items {
            match item.kind {
                ItemKind::LastOfMonth(w) => c.dow_last |= 1 << w,
                ItemKind::Nth { weekday, nth } => c.dow_nth[usize::from(weekday)] |= 1 << nth,
                _ => {}
            }
        }
        c.has_dom_specials = c.dom_last != 0 || c.dom_nearest != 0 || c.dom_last_weekday;
        c.has_dow_specials = c.dow_last != 0 || c.dow_nth.iter().any(|b| *b != 0);
        c.and_days = dom_field.is_star() || dow_field.is_star();
        let (dom_all, dow_all) = (c.dom == 0xffff_fffe, c.dow == 0x7f);
        c.every_day = if c.and_days {
            dom_all && dow_all && !c.has_dow_specials
        } else {
            dom_all || dow_all
        };
        c.check_can_fire(ast)?;
        Ok(c)
    }

    /// The days of month (`year`, `month`) that match, as bits 1..=31.
    #[inline]
    pub(crate) fn day_mask(&self, year: i32, month: u8) -> u32 {
        let len = days_in_month(year, month);
        if self.every_day {
            return ((1u64 << (len + 1)) - 2) as u32;
        }
        let w1 = weekday(days_from_civil(year, month, 1));
        self.day_mask_for(len, w1)
    }

    /// The matching days of a month of `len` days whose first day is weekday `w1`.
    #[inline]
    fn day_mask_for(&self, len: u8, w1: u8) -> u32 {
        let valid = ((1u64 << (len + 1)) - 2) as u32;
        let mut dom = self.dom & valid;
        if self.has_dom_specials {
            dom |= self.dom_specials(len, w1);
        }
        // Weekday bits rotated so that bit j is the weekday of day j + 1,
        // then repeated over five weeks.
        let r = u64::from(((self.dow >> w1) | (self.dow << (7 - w1))) & 0x7f);
        let pattern = (r | r << 7 | r << 14 | r << 21 | r << 28) << 1;
        let mut dow = pattern as u32 & valid;
        if self.has_dow_specials {
            dow |= self.dow_specials(len, w1);
        }
        if self.and_days { dom & dow } else { dom | dow }
    }

    fn dom_specials(&self, len: u8, w1: u8) -> u32 {
        let wd = |d: u8| (w1 + d - 1) % 7;
        let mut bits = 0u32;
        let mut last = self.dom_last;
        while last != 0 {
            let n = last.trailing_zeros() as u8;
            last &= last - 1;
            if n < len {
                bits |= 1 << (len - n);
            }
        }
        if self.dom_last_weekday {
            let d = match wd(len) {
                6 => len - 1,
                0 => len - 2,
                _ => len,
            };
            bits |= 1 << d;
        }
        let mut near = self.dom_nearest;
        while near != 0 {
            let n = near.trailing_zeros() as u8;
            near &= near - 1;
            if n > len {
                continue;
            }
            // Nearest weekday, never leaving the month.
            let d = match wd(n) {
                6 if n == 1 => 3,
                6 => n - 1,
                0 if n == len => n - 2,
                0 => n + 1,
                _ => n,
            };
            bits |= 1 << d;
        }
        bits
    }

    fn dow_specials(&self, len: u8, w1: u8) -> u32 {
        let mut bits = 0u32;
        let last_wd = (w1 + len - 1) % 7;
        for w in 0..7u8 {
            if self.dow_last & (1 << w) != 0 {
                bits |= 1 << (len - (last_wd + 7 - w) % 7);
            }
            let mut nth = self.dow_nth[usize::from(w)];
            if nth != 0 {
                let first = 1 + (w + 7 - w1) % 7;
                while nth != 0 {
                    let k = nth.trailing_zeros() as u8;
                    nth &= nth - 1;
                    let d = first + 7 * (k - 1);
                    if d <= len {
                        bits |= 1 << d;
                    }
                }
            }
        }
        bits
    }

    /// Rejects expressions that can never fire, by calendar arithmetic: every
    /// (month length, weekday of the 1st) pair occurs within 28 consecutive
    /// Gregorian years that include no skipped leap year, so checking 2000-2027
    /// decides expressions without a year field; with one, its years are checked.
    fn check_can_fire(&self, ast: &Ast) -> Result<(), ParseError> {
        let fires_in =
            |y: i32| (1..=12u8).any(|m| self.months & (1 << m) != 0 && self.day_mask(y, m) != 0);
        let ok = match &self.years {
            None => (2000..2028).any(fires_in),
            Some(years) => years.iter().any(fires_in),
        };
        if ok {
            return Ok(());
        }
        let dom = ast.field(FieldKind::DayOfMonth).expect("cron fields");
        let month = ast.field(FieldKind::Month).expect("cron fields");
        let dow = ast.field(FieldKind::DayOfWeek).expect("cron fields");
        let year = ast.field(FieldKind::Year).expect("cron fields");
        let src_of = |f: &crate::ast::Field<'_>| crate::explain::field_phrase(f);
        let would_without_years = self.years.is_some() && (2000..2028).any(fires_in);
        let (span, message) = if would_without_years {
            (
                dom.span.to(year.span),
                format!(
                    "this expression can never fire: {} {} does not occur in {}",
                    src_of(&dom),
                    src_of(&month),
                    src_of(&year)
                ),
            )
        } else if dow.is_any() || !self.and_days && self.dow == 0 && !self.has_dow_specials {
            (
                dom.span.to(month.span),
                format!(
                    "this expression can never fire: {} never occurs in {}",
                    src_of(&dom),
                    src_of(&month)
                ),
            )
        } else {
            (
                dom.span.to(dow.span),
                format!(
                    "this expression can never fire: no day is both {} and {} in {}",
                    src_of(&dom),
                    src_of(&dow),
                    src_of(&month)
                ),
            )
        };
        Err(ParseError::new(ErrorKind::NeverFires, span, message)
            .help("check the day-of-month against the lengths of the chosen months (February has 28 or 29 days; April, June, September and November 30)"))
    }

    /// Whether a civil second matches every field.
    pub(crate) fn matches_civil(&self, secs: i64) -> bool {
        let c = Civil::from_secs(secs);
        self.years.is_none_or(|y| y.contains(c.year))
            && self.months & (1 << c.month) != 0
            && self.day_mask(c.year, c.month) & (1 << c.day) != 0
            && self.hours & (1 << c.hour) != 0
            && self.minutes & (1 << c.minute) != 0
            && self.seconds & (1 << c.second) != 0
    }

    /// The first matching civil second in `[from, limit)`.
    pub(crate) fn next(&self, from: i64, limit: i64) -> Search {
        let c = Civil::from_secs(from);
        // The start day's count, reused while the search stays on that day.
        let from_day = (
            c.year,
            u32::from(c.month),
            u32::from(c.day),
            from.div_euclid(DAY),
        );
        let (mut y, mut mo, mut d) = (c.year, u32::from(c.month), u32::from(c.day));
        let (mut h, mut mi, mut s) = (u32::from(c.hour), u32::from(c.minute), u32::from(c.second));
        let mut mask_key = (i32::MIN, 0);
        let mut mask = 0u32;
        loop {
            if y > MAX_YEAR {
                return Search::Exhausted;
            }
            if let Some(years) = &self.years {
                match years.next(y) {
                    None => return Search::Exhausted,
                    Some(ny) if ny != y => (y, mo, d, h, mi, s) = (ny, 1, 1, 0, 0, 0),
                    _ => {}
                }
            }
            match next_bit(self.months, mo) {
                None => {
                    (y, mo, d, h, mi, s) = (y + 1, 1, 1, 0, 0, 0);
                    continue;
                }
                Some(m) if m != mo => (mo, d, h, mi, s) = (m, 1, 0, 0, 0),
                _ => {}
            }
            if mask_key != (y, mo) {
                mask_key = (y, mo);
                mask = self.day_mask(y, mo as u8);
            }
            match next_bit(u64::from(mask), d) {
                None => {
                    (mo, d, h, mi, s) = (mo + 1, 1, 0, 0, 0);
                    continue;
                }
                Some(nd) if nd != d => (d, h, mi, s) = (nd, 0, 0, 0),
                _ => {}
            }
            let day_start = if (y, mo, d) == (from_day.0, from_day.1, from_day.2) {
                from_day.3 * DAY
            } else {
                days_from_civil(y, mo as u8, d as u8) * DAY
            };
            if day_start >= limit {
                return Search::Beyond;
            }
            match next_bit(self.hours, h) {
                None => {
                    (d, h, mi, s) = (d + 1, 0, 0, 0);
                    continue;
                }
                Some(nh) if nh != h => (h, mi, s) = (nh, 0, 0),
                _ => {}
            }
            match next_bit(self.minutes, mi) {
                None => {
                    (h, mi, s) = (h + 1, 0, 0);
                    continue;
                }
                Some(nm) if nm != mi => (mi, s) = (nm, 0),
                _ => {}
            }
            match next_bit(self.seconds, s) {
                None => {
                    (mi, s) = (mi + 1, 0);
                    continue;
                }
                Some(ns) => s = ns,
            }
            let found = day_start + i64::from(h * 3600 + mi * 60 + s);
            return if found < limit {
                Search::Found(found)
            } else {
                Search::Beyond
            };
        }
    }

    /// The last matching civil second in `[limit, from]`.
    pub(crate) fn prev(&self, from: i64, limit: i64) -> Search {
        let c = Civil::from_secs(from);
        let (mut y, mut mo, mut d) = (c.year, i32::from(c.month), i32::from(c.day));
        let (mut h, mut mi, mut s) = (i32::from(c.hour), i32::from(c.minute), i32::from(c.second));
        let mut mask_key = (i32::MIN, 0);
        let mut mask = 0u32;
        loop {
            if y < MIN_YEAR {
                return Search::Exhausted;
            }
            if let Some(years) = &self.years {
                match years.prev(y) {
                    None => return Search::Exhausted,
                    Some(py) if py != y => (y, mo, d, h, mi, s) = (py, 12, 31, 23, 59, 59),
                    _ => {}
                }
            }
            match prev_bit(self.months, mo) {
                None => {
                    (y, mo, d, h, mi, s) = (y - 1, 12, 31, 23, 59, 59);
                    continue;
                }
                Some(m) if m != mo => (mo, d, h, mi, s) = (m, 31, 23, 59, 59),
                _ => {}
            }
            if mask_key != (y, mo) {
                mask_key = (y, mo);
                mask = self.day_mask(y, mo as u8);
            }
            match prev_bit(u64::from(mask), d) {
                None => {
                    (mo, d, h, mi, s) = (mo - 1, 31, 23, 59, 59);
                    continue;
                }
                Some(pd) if pd != d => (d, h, mi, s) = (pd, 23, 59, 59),
                _ => {}
            }
            let day_start = days_from_civil(y, mo as u8, d as u8) * DAY;
            if day_start + DAY - 1 < limit {
                return Search::Beyond;
            }
            match prev_bit(self.hours, h) {
                None => {
                    (d, h, mi, s) = (d - 1, 23, 59, 59);
                    continue;
                }
                Some(ph) if ph != h => (h, mi, s) = (ph, 59, 59),
                _ => {}
            }
            match prev_bit(self.minutes, mi) {
                None => {
                    (h, mi, s) = (h - 1, 59, 59);
                    continue;
                }
                Some(pm) if pm != mi => (mi, s) = (pm, 59),
                _ => {}
            }
            match prev_bit(self.seconds, s) {
                None => {
                    (mi, s) = (mi - 1, 59);
                    continue;
                }
                Some(ps) => s = ps,
            }
            let found = day_start + i64::from(h * 3600 + mi * 60 + s);
            return if found >= limit {
                Search::Found(found)
            } else {
                Search::Beyond
            };
        }
    }
}

/// The first set bit at or above `from`.
#[inline]
fn next_bit(bits: u64, from: u32) -> Option<u32> {
    if from >= 64 {
        return None;
    }
    let rest = bits >> from << from;
    (rest != 0).then(|| rest.trailing_zeros())
}

/// The last set bit at or below `from`.
#[inline]
fn prev_bit(bits: u64, from: i32) -> Option<i32> {
    if from < 0 {
        return None;
    }
    let rest = if from >= 63 {
        bits
    } else {
        bits & ((1u64 << (from + 1)) - 1)
    };
    (rest != 0).then(|| 63 - rest.leading_zeros() as i32)
}
