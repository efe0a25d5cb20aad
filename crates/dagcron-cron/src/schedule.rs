//! [`Schedule`]: a parsed, compiled expression in a time zone; its
//! [`Timetable`] answers the queries (next, previous, iterate, matches).

use jiff::Timestamp;
use jiff::tz::TimeZone;

use crate::ast::{Ast, Body, FieldKind};
use crate::civil::{CivilSet, Compiled};
use crate::error::ParseError;
use crate::rrule::Rrule;
use crate::zone::{DstGap, DstNote, DstOverlap, Policy, Walker};

/// Options that the expression itself does not carry.
#[derive(Clone, Debug)]
pub struct Options {
    /// The zone used unless the expression has a `CRON_TZ=`/`TZ=` prefix.
    pub time_zone: TimeZone,
    /// The seed `H` derives its values from; see [`crate::seed_from_key`].
    pub hash_seed: u64,
    /// Where `@every` periods are counted from (default: the Unix epoch).
    pub anchor: Option<Timestamp>,
    /// Overrides the default gap policy (shift for wall-clock times, skip for rhythms).
    pub dst_gap: Option<DstGap>,
    /// Overrides the default overlap policy (first for wall-clock times, both for rhythms).
    pub dst_overlap: Option<DstOverlap>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            time_zone: TimeZone::UTC,
            hash_seed: 0,
            anchor: None,
            dst_gap: None,
            dst_overlap: None,
        }
    }
}

/// One fire: its instant, and how a daylight-saving rule shaped it, if one did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fire {
    /// When it fires.
    pub at: Timestamp,
    /// Set when the fire was moved, collapsed or doubled by a DST transition.
    pub dst: Option<DstNote>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Cron(Compiled),
    Rule(Box<Rrule>),
    Every { period: i64, anchor: i64 },
    At(i64),
}

/// A cron expression ready to answer "when does it fire?".
///
/// ```
/// use dagcron_cron::Schedule;
/// let s = Schedule::parse("CRON_TZ=Europe/Berlin 0 30 2 LW * *").unwrap();
/// let t: jiff::Timestamp = "2026-11-29T00:00:00Z".parse().unwrap();
/// // November 30, 2026 is a Monday: 02:30 in Berlin is 01:30 UTC.
/// assert_eq!(s.next_after(t).unwrap().to_string(), "2026-11-30T01:30:00Z");
/// assert_eq!(s.explain(), "at 02:30 on the last weekday of every month, in Europe/Berlin");
/// ```
#[derive(Clone, Debug)]
pub struct Schedule {
    ast: Ast,
    table: Timetable,
}

/// What a [`Schedule`] compiles to, without its syntax tree: everything the
/// queries need and nothing else, about a hundred bytes. A scheduler holding
/// a million schedules keeps these and drops the rest.
///
/// A `Schedule` dereferences to its timetable, so the queries are called on
/// either.
#[derive(Clone, Debug)]
pub struct Timetable {
    kind: Kind,
    tz: TimeZone,
    /// The zone's offset when it has no transitions, to skip transition lookups.
    fixed: Option<i64>,
    wall_clock: bool,
    policy: Policy,
}

impl std::ops::Deref for Schedule {
    type Target = Timetable;

    fn deref(&self) -> &Timetable {
        &self.table
    }
}

impl Schedule {
    /// Parses an expression with default options (UTC, seed 0).
    pub fn parse(expr: &str) -> Result<Schedule, ParseError> {
        Schedule::parse_with(expr, &Options::default())
    }

    /// Parses an expression with the given options.
    pub fn parse_with(expr: &str, options: &Options) -> Result<Schedule, ParseError> {
        if crate::is_recurrence_rule(expr) {
            return Schedule::parse_rule(expr, options);
        }
        let ast = crate::parse::parse(expr, options.hash_seed)?;
        let tz = match &ast.time_zone {
            Some((name, span)) => crate::zone::lookup(name, *span)?,
            None => options.time_zone.clone(),
        };
        let fixed = tz.to_fixed_offset().ok().map(|o| i64::from(o.seconds()));
        let (kind, wall_clock) = match &ast.body {
            Body::Every { seconds, .. } => {
                let anchor = options.anchor.map_or(0, |a| a.as_second());
                (
                    Kind::Every {
                        period: *seconds,
                        anchor,
                    },
                    false,
                )
            }
            Body::At { second, .. } => (Kind::At(*second), false),
            Body::Rule(_) => unreachable!("rules are parsed by parse_rule"),
            Body::Fields { .. } => {
                let compiled = Compiled::new(&ast)?;
                let plain = [FieldKind::Second, FieldKind::Minute, FieldKind::Hour]
                    .iter()
                    .all(|k| {
                        ast.field(*k)
                            .expect("cron fields")
                            .items
                            .iter()
                            .all(|i| i.is_plain())
                    });
                (Kind::Cron(compiled), plain)
            }
        };
        let policy = Policy::defaults(wall_clock, options);
        Ok(Schedule {
            ast,
            table: Timetable {
                kind,
                tz,
                fixed,
                wall_clock,
                policy,
            },
        })
    }

    /// An RFC 5545 recurrence rule (`RRULE:`, with optional `DTSTART`,
    /// `EXDATE` and `RDATE` lines). Daily and coarser rules name wall-clock
    /// times; hourly and finer ones are rhythms (see the DST defaults).
    fn parse_rule(expr: &str, options: &Options) -> Result<Schedule, ParseError> {
        if expr.len() > crate::rrule::MAX_RULE_LEN {
            return Err(ParseError::new(
                crate::ErrorKind::TooLong,
                crate::Span::new(crate::rrule::MAX_RULE_LEN, expr.len()),
                format!(
                    "the rule is {} bytes long; at most {} are accepted",
                    expr.len(),
                    crate::rrule::MAX_RULE_LEN
                ),
            ));
        }
        crate::parse::check_ascii(expr)?;
        let rule = crate::rrule::parse(expr)?;
        let tz = match &rule.tzid {
            Some((name, span)) => crate::zone::lookup(name, *span)?,
            None => options.time_zone.clone(),
        };
        let mut compiled = rule.clone();
        compiled.compile(&tz)?;
        let wall_clock = !compiled.freq.sub_daily();
        let fixed = tz.to_fixed_offset().ok().map(|o| i64::from(o.seconds()));
        let schedule = Schedule {
            ast: Ast {
                time_zone: rule.tzid.clone(),
                body: Body::Rule(Box::new(rule)),
            },
            table: Timetable {
                kind: Kind::Rule(Box::new(compiled)),
                tz,
                fixed,
                wall_clock,
                policy: Policy::defaults(wall_clock, options),
            },
        };
        // Its normal form must parse too (it adds a DTSTART line and zones).
        let normal = schedule.normalized().len();
        if normal > crate::rrule::MAX_RULE_LEN {
            return Err(ParseError::new(
                crate::ErrorKind::TooLong,
                crate::Span::new(0, expr.len()),
                format!(
                    "the rule's normal form would be {normal} bytes long; at most {} are accepted",
                    crate::rrule::MAX_RULE_LEN
                ),
            ));
        }
        Ok(schedule)
    }

    /// The syntax tree, with spans.
    pub fn ast(&self) -> &Ast {
        &self.ast
    }

    /// The compiled form alone (see [`Timetable`]).
    pub fn timetable(&self) -> &Timetable {
        &self.table
    }
}

impl Timetable {
    /// The zone the schedule is evaluated in.
    pub fn time_zone(&self) -> &TimeZone {
        &self.tz
    }

    /// Whether the expression names wall-clock times (plain numbers in the
    /// second, minute and hour fields) rather than a rhythm.
    pub fn is_wall_clock(&self) -> bool {
        self.wall_clock
    }

    /// The gap policy in force.
    pub fn dst_gap(&self) -> DstGap {
        self.policy.gap
    }

    /// The overlap policy in force.
    pub fn dst_overlap(&self) -> DstOverlap {
        self.policy.overlap
    }

    pub(crate) fn compiled(&self) -> Option<&Compiled> {
        match &self.kind {
            Kind::Cron(c) => Some(c),
            Kind::Rule(_) | Kind::Every { .. } | Kind::At(_) => None,
        }
    }

    /// The compiled recurrence rule, for a rule.
    pub(crate) fn rule(&self) -> Option<&Rrule> {
        match &self.kind {
            Kind::Rule(r) => Some(r),
            _ => None,
        }
    }

    pub(crate) fn every(&self) -> Option<(i64, i64)> {
        match self.kind {
            Kind::Every { period, anchor } => Some((period, anchor)),
            _ => None,
        }
    }

    /// The one instant of an `@at` schedule, in Unix seconds.
    pub(crate) fn once(&self) -> Option<i64> {
        match self.kind {
            Kind::At(at) => Some(at),
            _ => None,
        }
    }

    fn walker(&self) -> Walker<'_> {
        let compiled: &dyn CivilSet = match &self.kind {
            Kind::Cron(c) => c,
            Kind::Rule(r) => r.as_ref(),
            Kind::Every { .. } | Kind::At(_) => unreachable!("walker is for cron fields and rules"),
        };
        Walker {
            compiled,
            tz: &self.tz,
            fixed: self.fixed,
            policy: self.policy,
            seg: None,
        }
    }

    /// The first fire strictly after `t`.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        self.next_fire_after(t).map(|f| f.at)
    }

    /// The last fire strictly before `t`.
    pub fn prev_before(&self, t: Timestamp) -> Option<Timestamp> {
        self.prev_fire_before(t).map(|f| f.at)
    }

    /// The first fire strictly after `t`, with its DST note.
    pub fn next_fire_after(&self, t: Timestamp) -> Option<Fire> {
        self.fires_after(t).next()
    }

    /// The last fire strictly before `t`, with its DST note.
    pub fn prev_fire_before(&self, t: Timestamp) -> Option<Fire> {
        self.fires_before(t).next()
    }

    /// Fires strictly after `t`, in increasing order.
    pub fn fires_after(&self, t: Timestamp) -> Fires<'_> {
        // The first whole second strictly after t.
        let from = t.as_second() + 1;
        self.fires(from, true)
    }

    /// Fires strictly before `t`, in decreasing order.
    pub fn fires_before(&self, t: Timestamp) -> Fires<'_> {
        // The last whole second strictly before t.
        let from = if t.subsec_nanosecond() > 0 {
            t.as_second()
        } else {
            t.as_second() - 1
        };
        self.fires(from, false)
    }

    fn fires(&self, from: i64, forward: bool) -> Fires<'_> {
        let state = match &self.kind {
            Kind::Cron(_) | Kind::Rule(_) => State::Cron(self.walker()),
            Kind::Every { .. } => State::Every,
            Kind::At(_) => State::At,
        };
        Fires {
            schedule: self,
            next: Some(from),
            forward,
            state,
        }
    }

    /// Whether `t` is a fire time.
    pub fn matches(&self, t: Timestamp) -> bool {
        t.subsec_nanosecond() == 0
            && self
                .fires(t.as_second(), true)
                .next()
                .is_some_and(|f| f.at == t)
    }
}

enum State<'a> {
    Cron(Walker<'a>),
    Every,
    At,
}

/// An iterator over fires, forward or backward; see [`Timetable::fires_after`].
pub struct Fires<'a> {
    schedule: &'a Timetable,
    /// The instant (whole seconds) the next search starts from, inclusive.
    next: Option<i64>,
    forward: bool,
    state: State<'a>,
}

impl Iterator for Fires<'_> {
    type Item = Fire;

    fn next(&mut self) -> Option<Fire> {
        let from = self.next?;
        let found = match &mut self.state {
            State::Cron(walker) => {
                if self.forward {
                    walker.next_from(from)
                } else {
                    walker.prev_from(from)
                }
            }
            State::Every => {
                let (period, anchor) = self.schedule.every().expect("every");
                let k = (i128::from(from) - i128::from(anchor)).div_euclid(i128::from(period));
                let at = if self.forward {
                    let at = i128::from(anchor) + k * i128::from(period);
                    if at < i128::from(from) {
                        at + i128::from(period)
                    } else {
                        at
                    }
                } else {
                    i128::from(anchor) + k * i128::from(period)
                };
                i64::try_from(at).ok().map(|at| (at, None))
            }
            State::At => {
                let at = self.schedule.once().expect("at");
                let ahead = if self.forward { at >= from } else { at <= from };
                ahead.then_some((at, None))
            }
        };
        let Some((at, dst)) = found else {
            self.next = None;
            return None;
        };
        let Ok(ts) = Timestamp::from_second(at) else {
            self.next = None;
            return None;
        };
        self.next = if self.forward {
            at.checked_add(1)
        } else {
            at.checked_sub(1)
        };
        Some(Fire { at: ts, dst })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timetable_is_small_and_answers_without_its_syntax() {
        // What a scheduler keeps per schedule: the bit sets, the zone and the
        // policy, inline.
        assert!(
            std::mem::size_of::<Timetable>() <= 128,
            "{}",
            std::mem::size_of::<Timetable>()
        );
        let s = Schedule::parse("0 30 2 LW * * 2026-2030").unwrap();
        let t: Timestamp = "2026-11-29T00:00:00Z".parse().unwrap();
        let table = s.timetable().clone();
        drop(s);
        assert_eq!(
            table.next_after(t).unwrap().to_string(),
            "2026-11-30T02:30:00Z"
        );
    }
}
