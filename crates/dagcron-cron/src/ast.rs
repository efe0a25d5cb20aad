//! The typed syntax tree of a cron expression, with source spans.
//!
//! The parser produces an [`Ast`]; [`crate::Schedule`] compiles it into bit
//! sets for the search and keeps it for explanations and error reporting.

use crate::error::Span;

/// One of the seven positions of a cron expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldKind {
    /// Seconds, 0-59 (absent in 5-field expressions, where it is 0).
    Second,
    /// Minutes, 0-59.
    Minute,
    /// Hours, 0-23.
    Hour,
    /// Day of the month, 1-31, with `L`, `L-n`, `LW` and `nW`.
    DayOfMonth,
    /// Month, 1-12 or `JAN`-`DEC`.
    Month,
    /// Day of the week, 0-7 (0 and 7 are Sunday) or `SUN`-`SAT`, with `nL` and `n#k`.
    DayOfWeek,
    /// Year, 1970-2099 (only in 7-field expressions).
    Year,
}

impl FieldKind {
    /// All fields in the order of a 7-field expression.
    pub const ALL: [FieldKind; 7] = [
        FieldKind::Second,
        FieldKind::Minute,
        FieldKind::Hour,
        FieldKind::DayOfMonth,
        FieldKind::Month,
        FieldKind::DayOfWeek,
        FieldKind::Year,
    ];

    /// The smallest value the field accepts.
    pub fn min(self) -> u16 {
        match self {
            FieldKind::DayOfMonth | FieldKind::Month => 1,
            FieldKind::Year => 1970,
            _ => 0,
        }
    }

    /// The largest value the field accepts (7 for day-of-week, as Sunday).
    pub fn max(self) -> u16 {
        match self {
            FieldKind::Second | FieldKind::Minute => 59,
            FieldKind::Hour => 23,
            FieldKind::DayOfMonth => 31,
            FieldKind::Month => 12,
            FieldKind::DayOfWeek => 7,
            FieldKind::Year => 2099,
        }
    }

    /// The end of `*` and of `a/n`: the field's maximum, except that the week
    /// ends on Saturday so that Sunday is not counted twice.
    pub(crate) fn open_max(self) -> u16 {
        match self {
            FieldKind::DayOfWeek => 6,
            k => k.max(),
        }
    }

    /// The field's name as the documentation and error messages spell it.
    pub fn name(self) -> &'static str {
        match self {
            FieldKind::Second => "second",
            FieldKind::Minute => "minute",
            FieldKind::Hour => "hour",
            FieldKind::DayOfMonth => "day-of-month",
            FieldKind::Month => "month",
            FieldKind::DayOfWeek => "day-of-week",
            FieldKind::Year => "year",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Where a step starts and ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepBase {
    /// `*/n`: the whole field.
    Any,
    /// `a/n`: from `a` to the end of the field.
    From(u16),
    /// `a-b/n`.
    Range(u16, u16),
}

/// One element of a field's comma-separated list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemKind {
    /// `*`.
    Any,
    /// `?` (day-of-month or day-of-week only, alone): the same as `*`.
    NoSpecific,
    /// A number or a name.
    Value(u16),
    /// `a-b`.
    Range(u16, u16),
    /// `*/n`, `a/n`, `a-b/n`.
    Step {
        /// What the step walks over.
        base: StepBase,
        /// The increment, at least 1.
        step: u32,
    },
    /// `H`, `H(a-b)`, `H/n`, `H(a-b)/n`: a value derived from the schedule's
    /// hash seed, already resolved.
    Hash {
        /// Range the value is taken from.
        lo: u16,
        /// End of that range.
        hi: u16,
        /// The step, if any.
        step: Option<u32>,
        /// The value chosen (the first value, with a step).
        start: u16,
    },
    /// `L` (offset 0) or `L-n`: the last day of the month, or n days before it.
    LastDay(u16),
    /// `LW`: the last weekday (Monday-Friday) of the month.
    LastWeekday,
    /// `nW`: the weekday nearest day n, within the month.
    NearestWeekday(u16),
    /// `nL`: the last given weekday of the month (0 = Sunday).
    LastOfMonth(u8),
    /// `n#k`: the k-th given weekday of the month.
    Nth {
        /// 0 = Sunday .. 6 = Saturday.
        weekday: u8,
        /// 1..=5.
        nth: u8,
    },
}

/// One element of a list, with where it was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    /// Where in the source.
    pub span: Span,
    /// What it says.
    pub kind: ItemKind,
}

impl Item {
    /// Whether the item is a plain number (or name, or unstepped `H`), the
    /// kind of element that names a wall-clock time.
    pub(crate) fn is_plain(&self) -> bool {
        matches!(
            self.kind,
            ItemKind::Value(_) | ItemKind::Hash { step: None, .. }
        )
    }
}

/// A field of a cron expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field<'a> {
    /// Which field.
    pub kind: FieldKind,
    /// Where in the source (empty for a field the expression left out).
    pub span: Span,
    /// The comma-separated elements.
    pub items: &'a [Item],
    /// Whether the user wrote it (false for the seconds of a 5-field
    /// expression and the year of a 5- or 6-field one).
    pub written: bool,
}

impl Field<'_> {
    /// Whether the field starts with `*` or is `?`: for the day fields this
    /// decides whether both must match (Vixie cron's rule).
    pub fn is_star(&self) -> bool {
        matches!(
            self.items.first().map(|i| i.kind),
            Some(
                ItemKind::Any
                    | ItemKind::NoSpecific
                    | ItemKind::Step {
                        base: StepBase::Any,
                        ..
                    }
            )
        )
    }

    /// Whether the field is exactly `*` or `?`.
    pub fn is_any(&self) -> bool {
        self.items
            .iter()
            .any(|i| matches!(i.kind, ItemKind::Any | ItemKind::NoSpecific))
    }
}

/// An `@` shorthand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Descriptor {
    /// `@yearly`, `@annually`.
    Yearly,
    /// `@monthly`.
    Monthly,
    /// `@weekly`.
    Weekly,
    /// `@daily`, `@midnight`.
    Daily,
    /// `@hourly`.
    Hourly,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) span: Span,
    pub(crate) start: u16,
    pub(crate) len: u16,
    pub(crate) written: bool,
}

/// What the expression describes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Body {
    /// Cron fields (descriptors other than `@every` are expanded to fields).
    Fields {
        /// How many fields were written (5, 6 or 7; 6 for descriptors).
        count: u8,
        slots: [Slot; 7],
        items: Vec<Item>,
        descriptor: Option<Descriptor>,
    },
    /// `@every <duration>`, in whole seconds.
    Every { seconds: i64, span: Span },
    /// `@at <RFC 3339 instant>`: one fire, at this Unix second.
    At { second: i64, span: Span },
    /// An RFC 5545 recurrence rule, as written.
    Rule(Box<crate::rrule::Rrule>),
}

/// A parsed cron expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ast {
    pub(crate) time_zone: Option<(String, Span)>,
    pub(crate) body: Body,
}

impl Ast {
    /// The zone named by a `CRON_TZ=` or `TZ=` prefix, with its span.
    pub fn time_zone_prefix(&self) -> Option<(&str, Span)> {
        self.time_zone.as_ref().map(|(n, s)| (n.as_str(), *s))
    }

    /// A field, or `None` for `@every` expressions.
    pub fn field(&self, kind: FieldKind) -> Option<Field<'_>> {
        match &self.body {
            Body::Fields { slots, items, .. } => {
                let slot = slots[kind.index()];
                let start = usize::from(slot.start);
                Some(Field {
                    kind,
                    span: slot.span,
                    items: &items[start..start + usize::from(slot.len)],
                    written: slot.written,
                })
            }
            Body::Every { .. } | Body::At { .. } | Body::Rule(_) => None,
        }
    }

    /// The number of fields the user wrote (5, 6 or 7), or `None` for a
    /// descriptor.
    pub fn field_count(&self) -> Option<u8> {
        match &self.body {
            Body::Fields {
                count,
                descriptor: None,
                ..
            } => Some(*count),
            _ => None,
        }
    }

    /// The `@` descriptor the expression used, other than `@every`.
    pub fn descriptor(&self) -> Option<Descriptor> {
        match &self.body {
            Body::Fields { descriptor, .. } => *descriptor,
            Body::Every { .. } | Body::At { .. } | Body::Rule(_) => None,
        }
    }

    /// The period of an `@every` expression, in seconds.
    pub fn every_seconds(&self) -> Option<i64> {
        match &self.body {
            Body::Every { seconds, .. } => Some(*seconds),
            Body::Fields { .. } | Body::At { .. } | Body::Rule(_) => None,
        }
    }

    /// Whether the schedule is an RFC 5545 recurrence rule.
    pub fn is_rule(&self) -> bool {
        matches!(self.body, Body::Rule(_))
    }

    /// The instant of an `@at` expression.
    pub fn at(&self) -> Option<jiff::Timestamp> {
        match &self.body {
            Body::At { second, .. } => jiff::Timestamp::from_second(*second).ok(),
            _ => None,
        }
    }
}
