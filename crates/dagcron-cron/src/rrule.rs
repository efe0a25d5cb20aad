//! RFC 5545 recurrence rules: `RRULE:FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1`,
//! with optional `DTSTART`, `EXDATE` and `RDATE` lines.
//!
//! The rule is parsed into an [`Rrule`] whose search works on civil seconds,
//! like the cron search of [`crate::civil`], so the time zone walker of
//! [`crate::zone`] applies the same daylight-saving policies to both.
//!
//! How the set is built (RFC 5545 section 3.3.10, as python-dateutil does):
//! the rule walks *periods* of its frequency (years, months, weeks, days,
//! hours, minutes, seconds) every `INTERVAL` from `DTSTART`'s; in each period
//! the `BY` parts expand or limit the candidate times, `BYSETPOS` picks among
//! them, and what falls before `DTSTART`, after `UNTIL` or past `COUNT` is
//! dropped. `EXDATE` removes times, `RDATE` adds them.
//!
//! The search never steps through time one second at a time: days are
//! scanned within the periods on the rule's lattice, and times within a day
//! jump from set bit to set bit of the hour, minute and second masks.

use crate::calendar::{DAY, civil_from_days, days_from_civil, days_in_month, is_leap, weekday};
use crate::civil::{MAX_YEAR, MIN_YEAR, Search};
use crate::error::{ErrorKind, ParseError, Span};

/// The longest recurrence text accepted, in bytes (room for a year of
/// holidays as `EXDATE`s).
pub const MAX_RULE_LEN: usize = 16_384;
/// The largest `COUNT`.
pub const MAX_COUNT: u32 = 100_000;
/// The largest `INTERVAL`.
pub const MAX_INTERVAL: u32 = 1_000_000;
/// The most `EXDATE` plus `RDATE` values.
pub const MAX_DATES: usize = 500;

/// Whether `text` is written as a recurrence rule rather than a cron expression.
pub(crate) fn looks_like_rule(text: &str) -> bool {
    let t = text.trim_start().as_bytes();
    ["RRULE:", "DTSTART", "EXDATE", "RDATE"]
        .iter()
        .any(|p| t.len() >= p.len() && t[..p.len()].eq_ignore_ascii_case(p.as_bytes()))
}

/// The rule's frequency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Freq {
    /// `YEARLY`.
    Yearly,
    /// `MONTHLY`.
    Monthly,
    /// `WEEKLY`.
    Weekly,
    /// `DAILY`.
    Daily,
    /// `HOURLY`.
    Hourly,
    /// `MINUTELY`.
    Minutely,
    /// `SECONDLY`.
    Secondly,
}

const FREQS: [(&str, Freq); 7] = [
    ("YEARLY", Freq::Yearly),
    ("MONTHLY", Freq::Monthly),
    ("WEEKLY", Freq::Weekly),
    ("DAILY", Freq::Daily),
    ("HOURLY", Freq::Hourly),
    ("MINUTELY", Freq::Minutely),
    ("SECONDLY", Freq::Secondly),
];

impl Freq {
    /// The name as RFC 5545 spells it.
    pub fn name(self) -> &'static str {
        FREQS[self as usize].0
    }

    /// Seconds in one period of a sub-daily frequency.
    fn unit(self) -> i64 {
        match self {
            Freq::Hourly => 3600,
            Freq::Minutely => 60,
            _ => 1,
        }
    }

    pub(crate) fn sub_daily(self) -> bool {
        self >= Freq::Hourly
    }
}

/// Weekday names in RFC 5545 order (0 = Monday).
pub(crate) const DAYS: [&str; 7] = ["MO", "TU", "WE", "TH", "FR", "SA", "SU"];

const PARTS: [&str; 14] = [
    "FREQ",
    "INTERVAL",
    "COUNT",
    "UNTIL",
    "BYSECOND",
    "BYMINUTE",
    "BYHOUR",
    "BYDAY",
    "BYMONTHDAY",
    "BYYEARDAY",
    "BYWEEKNO",
    "BYMONTH",
    "BYSETPOS",
    "WKST",
];

/// A time as written: a wall-clock time in the schedule's zone, or an
/// instant (a trailing `Z`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum When {
    /// Civil seconds.
    Local(i64),
    /// Unix seconds.
    Utc(i64),
    /// A date alone (`VALUE=DATE`): civil seconds of its midnight.
    Date(i64),
}

/// A parsed recurrence rule; [`Rrule::compile`] readies it for searching.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Rrule {
    pub(crate) freq: Freq,
    pub(crate) interval: u32,
    /// Civil seconds.
    pub(crate) dtstart: i64,
    pub(crate) dtstart_written: Option<When>,
    pub(crate) count: Option<u32>,
    pub(crate) until: Option<When>,
    /// Bit m for month m (1-12); 0 when not given.
    pub(crate) months: u16,
    pub(crate) monthdays: Vec<i8>,
    pub(crate) yeardays: Vec<i16>,
    pub(crate) weeknos: Vec<i8>,
    /// (n, weekday 0 = Monday); n = 0 for every such weekday.
    pub(crate) weekdays: Vec<(i8, u8)>,
    /// Written hour, minute and second lists (masks; 0 when not given).
    pub(crate) by_hour: u32,
    pub(crate) by_minute: u64,
    pub(crate) by_second: u64,
    pub(crate) setpos: Vec<i32>,
    pub(crate) wkst: u8,
    pub(crate) exdates: Vec<When>,
    pub(crate) rdates: Vec<When>,
    /// The zone named by `TZID=`, with its span.
    pub(crate) tzid: Option<(String, Span)>,
    /// Whole text span, for errors about the rule as a whole.
    pub(crate) span: Span,
    // What compile() derives.
    pub(crate) c: Compiled,
}

/// What [`Rrule::compile`] derives: masks with their defaults, the times a
/// sub-daily period holds, the civil end and the civil dates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Compiled {
    hours: u32,
    minutes: u64,
    seconds: u64,
    /// Sub-daily: offsets within one period (after `BYSETPOS`).
    inner: Vec<u32>,
    /// The last civil second the rule may produce (from `UNTIL` or `COUNT`).
    pub(crate) end: Option<i64>,
    exdates: Vec<i64>,
    /// Days an `EXDATE;VALUE=DATE` removes whole.
    exdays: Vec<i64>,
    rdates: Vec<i64>,
    /// The period (YEARLY to DAILY: year, month, week or day index) the lattice starts from.
    chunk0: i64,
    /// Sub-daily: `DTSTART`'s hour, minute or second counted from 1970.
    unit0: i64,
    /// Some mask is empty: the rule produces nothing.
    never: bool,
}

fn err(kind: ErrorKind, span: Span, message: impl Into<String>) -> ParseError {
    ParseError::new(kind, span, message)
}

/// Parses a recurrence text: properties separated by line breaks or blanks.
pub(crate) fn parse(src: &str) -> Result<Rrule, ParseError> {
    let bytes = src.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let start = i;
        while i < bytes.len() && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if start < i {
            tokens.push(Span::new(start, i));
        }
    }
    let whole = Span::new(
        tokens.first().map_or(0, |s| s.start),
        tokens.last().map_or(src.len(), |s| s.end),
    );
    let mut rule: Option<(Span, &str)> = None;
    let mut dtstart: Option<(When, Span)> = None;
    let mut tzid: Option<(String, Span)> = None;
    let mut exdates = Vec::new();
    // The zones EXDATE and RDATE lines name: each must be DTSTART's.
    let mut dates_tz: Vec<(String, Span)> = Vec::new();
    let mut rdates = Vec::new();
    for tok in tokens {
        let text = &src[tok.start..tok.end];
        let Some(colon) = text.find(':') else {
            return Err(err(ErrorKind::Recurrence, tok, format!("`{text}` is not a property: expected `NAME:value`"))
                .help("write `RRULE:FREQ=...`, and optionally `DTSTART:...`, `EXDATE:...` or `RDATE:...`, separated by line breaks or blanks"));
        };
        let head = &text[..colon];
        let value_span = Span::new(tok.start + colon + 1, tok.end);
        let mut params = head.split(';');
        let name = params.next().unwrap_or_default().to_ascii_uppercase();
        let name_span = Span::new(tok.start, tok.start + name.len());
        let mut param_tz = None;
        let mut date_only = false;
        let mut off = tok.start + name.len();
        for p in params {
            let pspan = Span::new(off + 1, off + 1 + p.len());
            off += 1 + p.len();
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            if k.eq_ignore_ascii_case("TZID") && name != "RRULE" {
                let vspan = Span::new(pspan.start + k.len() + 1, pspan.end);
                crate::zone::lookup(v, vspan)?;
                param_tz = Some((v.to_string(), vspan));
            } else if k.eq_ignore_ascii_case("VALUE") && name != "RRULE" {
                if v.eq_ignore_ascii_case("DATE") {
                    date_only = true;
                } else if !v.eq_ignore_ascii_case("DATE-TIME") {
                    return Err(err(
                        ErrorKind::Recurrence,
                        pspan,
                        format!("`VALUE={v}` is not supported"),
                    )
                    .help("use `VALUE=DATE` or `VALUE=DATE-TIME`"));
                }
            } else {
                return Err(err(
                    ErrorKind::Recurrence,
                    pspan,
                    format!("unknown parameter `{p}` of {name}"),
                )
                .help("only `TZID=` and `VALUE=` are accepted, and not on RRULE"));
            }
        }
        match name.as_str() {
            "RRULE" => {
                if let Some((first, _)) = rule {
                    return Err(err(ErrorKind::Recurrence, name_span, "a second RRULE")
                        .help(format!("one rule per schedule (the first is at byte {}); list several schedules instead", first.start)));
                }
                rule = Some((value_span, &src[value_span.start..value_span.end]));
            }
            "DTSTART" => {
                if dtstart.is_some() {
                    return Err(err(ErrorKind::Recurrence, name_span, "a second DTSTART"));
                }
                let value = &src[value_span.start..value_span.end];
                let when = parse_when(value, value_span, date_only)?;
                if matches!(when, When::Utc(_)) && param_tz.is_some() {
                    return Err(err(
                        ErrorKind::TimeZone,
                        value_span,
                        "a UTC time (trailing `Z`) with a TZID",
                    )
                    .help("drop the `Z` to give a wall-clock time in that zone"));
                }
                tzid = param_tz;
                dtstart = Some((when, value_span));
            }
            "EXDATE" | "RDATE" => {
                dates_tz.extend(param_tz);
                let list = if name == "EXDATE" {
                    &mut exdates
                } else {
                    &mut rdates
                };
                let mut pos = value_span.start;
                for v in src[value_span.start..value_span.end].split(',') {
                    let vspan = Span::new(pos, pos + v.len());
                    pos += v.len() + 1;
                    list.push(parse_when(v, vspan, date_only)?);
                }
            }
            _ => {
                let best = ["RRULE", "DTSTART", "EXDATE", "RDATE"]
                    .into_iter()
                    .min_by_key(|n| crate::parse::edit_distance(&name, n))
                    .expect("names");
                return Err(err(
                    ErrorKind::Recurrence,
                    name_span,
                    format!("unknown property `{name}`"),
                )
                .help(format!(
                    "did you mean `{best}`? (RRULE, DTSTART, EXDATE and RDATE are accepted)"
                )));
            }
        }
    }
    if exdates.len() + rdates.len() > MAX_DATES {
        return Err(err(
            ErrorKind::TooLong,
            whole,
            format!(
                "{} EXDATE and RDATE values; at most {MAX_DATES} are accepted",
                exdates.len() + rdates.len()
            ),
        ));
    }
    let Some((rule_span, rule_text)) = rule else {
        return Err(err(ErrorKind::Recurrence, whole, "no RRULE")
            .help("add a line such as `RRULE:FREQ=DAILY;BYHOUR=9`"));
    };
    let utc_start = matches!(dtstart, Some((When::Utc(_), _)));
    for (zone, span) in &dates_tz {
        let same = tzid.as_ref().is_some_and(|(t, _)| t == zone);
        if !same {
            let why = match &tzid {
                _ if utc_start => "DTSTART is in UTC (a trailing `Z`)".to_string(),
                Some((t, _)) => format!("DTSTART's is `TZID={t}`"),
                None => "DTSTART names no zone (the job's applies)".to_string(),
            };
            return Err(err(
                ErrorKind::TimeZone,
                *span,
                format!("`TZID={zone}` on EXDATE or RDATE, but {why}"),
            )
            .help("one rule is evaluated in one zone: give EXDATE and RDATE the TZID of DTSTART, none, or write their times in UTC with a trailing `Z`"));
        }
    }
    if utc_start {
        tzid = Some(("UTC".to_string(), dtstart.expect("set").1));
    }
    let mut r = parse_rule(rule_text, rule_span.start)?;
    r.span = whole;
    r.tzid = tzid;
    r.exdates = exdates;
    r.rdates = rdates;
    if let Some((when, _)) = dtstart {
        r.dtstart_written = Some(when);
        r.dtstart = match when {
            When::Local(c) | When::Date(c) | When::Utc(c) => c,
        };
    }
    check_combinations(&r, rule_span, rule_text)?;
    Ok(r)
}

/// `YYYYMMDD` or `YYYYMMDDTHHMMSS`, with an optional `Z`.
fn parse_when(v: &str, span: Span, date_only: bool) -> Result<When, ParseError> {
    let bad = || {
        err(ErrorKind::Instant, span, format!("`{v}` is not a date-time"))
            .help("write `YYYYMMDDTHHMMSS` (wall-clock time in the rule's zone), `YYYYMMDDTHHMMSSZ` (UTC) or `YYYYMMDD` (a date)")
    };
    let b = v.as_bytes();
    let digits = |r: std::ops::Range<usize>| -> Option<u32> {
        let s = b.get(r)?;
        s.iter()
            .all(u8::is_ascii_digit)
            .then(|| s.iter().fold(0, |a, d| a * 10 + u32::from(d - b'0')))
    };
    let (y, mo, d) = (
        digits(0..4).ok_or_else(bad)?,
        digits(4..6).ok_or_else(bad)?,
        digits(6..8).ok_or_else(bad)?,
    );
    if y < 1 || !(1..=12).contains(&mo) || d < 1 || d > u32::from(days_in_month(y as i32, mo as u8))
    {
        return Err(err(
            ErrorKind::OutOfRange,
            span,
            format!("`{v}` names no day of the calendar"),
        ));
    }
    let day = days_from_civil(y as i32, mo as u8, d as u8) * DAY;
    if b.len() == 8 {
        return Ok(When::Date(day));
    }
    if date_only || b.len() < 15 || b[8] != b'T' {
        return Err(bad());
    }
    let (h, mi, s) = (
        digits(9..11).ok_or_else(bad)?,
        digits(11..13).ok_or_else(bad)?,
        digits(13..15).ok_or_else(bad)?,
    );
    if h > 23 || mi > 59 || s > 59 {
        return Err(err(
            ErrorKind::OutOfRange,
            span,
            format!("`{v}` names no time of day"),
        ));
    }
    let civil = day + i64::from(h * 3600 + mi * 60 + s);
    match &b[15..] {
        b"" => Ok(When::Local(civil)),
        b"Z" | b"z" if civil > jiff::Timestamp::MAX.as_second() => Err(err(
            ErrorKind::OutOfRange,
            span,
            format!(
                "`{v}` is after the last instant supported, {}",
                jiff::Timestamp::MAX
            ),
        )),
        b"Z" | b"z" => Ok(When::Utc(civil)),
        _ => Err(bad()),
    }
}

fn parse_rule(text: &str, base: usize) -> Result<Rrule, ParseError> {
    let mut r = Rrule {
        freq: Freq::Daily,
        interval: 1,
        dtstart: 0,
        dtstart_written: None,
        count: None,
        until: None,
        months: 0,
        monthdays: Vec::new(),
        yeardays: Vec::new(),
        weeknos: Vec::new(),
        weekdays: Vec::new(),
        by_hour: 0,
        by_minute: 0,
        by_second: 0,
        setpos: Vec::new(),
        wkst: 0,
        exdates: Vec::new(),
        rdates: Vec::new(),
        tzid: None,
        span: Span::new(base, base + text.len()),
        c: Compiled::default(),
    };
    let mut seen: Vec<&str> = Vec::new();
    let mut freq = None;
    let mut pos = base;
    for part in text.split(';') {
        let pspan = Span::new(pos, pos + part.len());
        pos += part.len() + 1;
        if part.is_empty() {
            return Err(err(
                ErrorKind::EmptyElement,
                pspan,
                "an empty rule part (`;;` or a trailing `;`)",
            ));
        }
        let Some((name, value)) = part.split_once('=') else {
            return Err(err(
                ErrorKind::Recurrence,
                pspan,
                format!("`{part}` is not a rule part: expected `NAME=value`"),
            ));
        };
        let upper = name.to_ascii_uppercase();
        let nspan = Span::new(pspan.start, pspan.start + name.len());
        let vspan = Span::new(nspan.end + 1, pspan.end);
        let Some(&known) = PARTS.iter().find(|p| **p == upper) else {
            let best = PARTS
                .iter()
                .min_by_key(|p| crate::parse::edit_distance(&upper, p))
                .expect("parts");
            return Err(err(
                ErrorKind::Recurrence,
                nspan,
                format!("unknown rule part `{name}`"),
            )
            .help(format!("did you mean `{best}`?")));
        };
        if seen.contains(&known) {
            return Err(err(
                ErrorKind::Recurrence,
                nspan,
                format!("`{known}` is given twice"),
            ));
        }
        seen.push(known);
        if value.is_empty() {
            return Err(err(
                ErrorKind::EmptyElement,
                vspan,
                format!("`{known}` has no value"),
            ));
        }
        let v = value.to_ascii_uppercase();
        match known {
            "FREQ" => {
                let Some((_, f)) = FREQS.iter().find(|(n, _)| *n == v) else {
                    let best = FREQS
                        .iter()
                        .min_by_key(|(n, _)| crate::parse::edit_distance(&v, n))
                        .expect("freqs")
                        .0;
                    return Err(err(ErrorKind::UnknownName, vspan, format!("unknown frequency `{value}`"))
                        .help(format!("did you mean `{best}`? (YEARLY, MONTHLY, WEEKLY, DAILY, HOURLY, MINUTELY or SECONDLY)")));
                };
                freq = Some(*f);
            }
            "INTERVAL" => {
                r.interval = number(&v, vspan, 1, i64::from(MAX_INTERVAL), "INTERVAL")? as u32
            }
            "COUNT" => r.count = Some(number(&v, vspan, 1, i64::from(MAX_COUNT), "COUNT")? as u32),
            "UNTIL" => r.until = Some(parse_when(&v, vspan, false)?),
            "BYSECOND" => r.by_second = mask(&v, vspan, 0, 59, "BYSECOND")?,
            "BYMINUTE" => r.by_minute = mask(&v, vspan, 0, 59, "BYMINUTE")?,
            "BYHOUR" => r.by_hour = mask(&v, vspan, 0, 23, "BYHOUR")? as u32,
            "BYMONTH" => r.months = mask(&v, vspan, 1, 12, "BYMONTH")? as u16,
            "BYMONTHDAY" => {
                r.monthdays = signed(&v, vspan, 31, "BYMONTHDAY")?
                    .into_iter()
                    .map(|x| x as i8)
                    .collect()
            }
            "BYYEARDAY" => {
                r.yeardays = signed(&v, vspan, 366, "BYYEARDAY")?
                    .into_iter()
                    .map(|x| x as i16)
                    .collect()
            }
            "BYWEEKNO" => {
                r.weeknos = signed(&v, vspan, 53, "BYWEEKNO")?
                    .into_iter()
                    .map(|x| x as i8)
                    .collect()
            }
            "BYSETPOS" => r.setpos = signed(&v, vspan, 366, "BYSETPOS")?,
            "BYDAY" => r.weekdays = by_day(&v, vspan)?,
            "WKST" => r.wkst = day_name(&v, vspan)?,
            _ => unreachable!("every part is handled"),
        }
    }
    let Some(f) = freq else {
        return Err(err(ErrorKind::Recurrence, r.span, "the rule has no FREQ")
            .help("start with `FREQ=YEARLY`, `MONTHLY`, `WEEKLY`, `DAILY`, `HOURLY`, `MINUTELY` or `SECONDLY`"));
    };
    r.freq = f;
    Ok(r)
}

/// The span of a part (`BYDAY=...`) in the rule text, or the whole rule.
fn part_span(rule: Span, text: &str, name: &str) -> Span {
    let mut pos = rule.start;
    for part in text.split(';') {
        if part
            .split('=')
            .next()
            .is_some_and(|n| n.eq_ignore_ascii_case(name))
        {
            return Span::new(pos, pos + part.len());
        }
        pos += part.len() + 1;
    }
    rule
}

/// What RFC 5545 forbids, and what has no meaning without `DTSTART`.
fn check_combinations(r: &Rrule, rule: Span, text: &str) -> Result<(), ParseError> {
    let f = r.freq.name();
    let refuse = |part: &str, why: String, help: &str| {
        Err(err(ErrorKind::Misplaced, part_span(rule, text, part), why).help(help.to_string()))
    };
    if !r.weeknos.is_empty() && r.freq != Freq::Yearly {
        return refuse(
            "BYWEEKNO",
            format!("BYWEEKNO is only meaningful with FREQ=YEARLY, not {f}"),
            "use BYWEEKNO with FREQ=YEARLY",
        );
    }
    if !r.yeardays.is_empty() && matches!(r.freq, Freq::Monthly | Freq::Weekly | Freq::Daily) {
        return refuse(
            "BYYEARDAY",
            format!("BYYEARDAY cannot be used with FREQ={f} (RFC 5545)"),
            "use BYMONTHDAY, or FREQ=YEARLY",
        );
    }
    if !r.monthdays.is_empty() && r.freq == Freq::Weekly {
        return refuse(
            "BYMONTHDAY",
            "BYMONTHDAY cannot be used with FREQ=WEEKLY (RFC 5545)".into(),
            "use BYDAY for days of the week, or FREQ=MONTHLY",
        );
    }
    if r.weekdays.iter().any(|(n, _)| *n != 0) {
        if !matches!(r.freq, Freq::Monthly | Freq::Yearly) {
            return refuse(
                "BYDAY",
                format!("a numbered BYDAY (such as `1MO`) needs FREQ=MONTHLY or YEARLY, not {f}"),
                "drop the number (`MO` is every Monday), or use FREQ=MONTHLY or YEARLY",
            );
        }
        if !r.weeknos.is_empty() {
            return refuse(
                "BYDAY",
                "a numbered BYDAY cannot be combined with BYWEEKNO (RFC 5545)".into(),
                "drop the number or BYWEEKNO",
            );
        }
        let in_month = r.freq == Freq::Monthly || r.months != 0;
        let max = if in_month { 5 } else { 53 };
        if let Some((n, _)) = r.weekdays.iter().find(|(n, _)| n.unsigned_abs() > max) {
            return refuse(
                "BYDAY",
                format!(
                    "`{n}` is beyond the {max} times a weekday occurs in a {}",
                    if in_month { "month" } else { "year" }
                ),
                "count from 1, or from the end with -1",
            );
        }
    }
    let by_parts = r.months != 0
        || !r.monthdays.is_empty()
        || !r.yeardays.is_empty()
        || !r.weeknos.is_empty()
        || !r.weekdays.is_empty()
        || r.by_hour != 0
        || r.by_minute != 0
        || r.by_second != 0;
    if !r.setpos.is_empty() && !by_parts {
        return refuse(
            "BYSETPOS",
            "BYSETPOS needs another BY part to pick from (RFC 5545)".into(),
            "add the parts it picks among, such as `BYDAY=MO,TU,WE,TH,FR`",
        );
    }
    if r.count.is_some() && r.until.is_some() {
        return refuse(
            "UNTIL",
            "COUNT and UNTIL cannot both be given (RFC 5545)".into(),
            "keep one of them",
        );
    }
    if r.freq == Freq::Weekly && r.weekdays.is_empty() && r.dtstart_written.is_none() {
        return refuse(
            "FREQ",
            "FREQ=WEEKLY without BYDAY repeats DTSTART's weekday, and there is no DTSTART".into(),
            "add `BYDAY=MO` (for example) or a DTSTART line",
        );
    }
    Ok(())
}

fn number(v: &str, span: Span, lo: i64, hi: i64, what: &str) -> Result<i64, ParseError> {
    let n: i64 = v.parse().map_err(|_| {
        err(
            ErrorKind::UnexpectedChar,
            span,
            format!("`{v}` is not a number ({what})"),
        )
    })?;
    if !(lo..=hi).contains(&n) || v.starts_with('+') {
        return Err(err(
            ErrorKind::OutOfRange,
            span,
            format!("{what} must be {lo}-{hi}, not {v}"),
        ));
    }
    Ok(n)
}

fn mask(v: &str, span: Span, lo: i64, hi: i64, what: &str) -> Result<u64, ParseError> {
    let mut bits = 0u64;
    let mut pos = span.start;
    for item in v.split(',') {
        let ispan = Span::new(pos, pos + item.len());
        pos += item.len() + 1;
        if item == "60" && what == "BYSECOND" {
            return Err(err(
                ErrorKind::OutOfRange,
                ispan,
                "leap seconds (BYSECOND=60) are not supported",
            )
            .help("seconds are 0-59"));
        }
        bits |= 1 << number(item, ispan, lo, hi, what)?;
    }
    Ok(bits)
}

fn signed(v: &str, span: Span, max: i64, what: &str) -> Result<Vec<i32>, ParseError> {
    let mut out = Vec::new();
    let mut pos = span.start;
    for item in v.split(',') {
        let ispan = Span::new(pos, pos + item.len());
        pos += item.len() + 1;
        let digits = item.strip_prefix(['+', '-']).unwrap_or(item);
        let n = number(digits, ispan, 1, max, what).map_err(|e| {
            err(
                e.kind,
                ispan,
                format!("{what} values are 1 to {max} or -{max} to -1, not `{item}`"),
            )
        })?;
        out.push(if item.starts_with('-') { -n } else { n } as i32);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn day_name(v: &str, span: Span) -> Result<u8, ParseError> {
    DAYS.iter()
        .position(|d| *d == v)
        .map(|p| p as u8)
        .ok_or_else(|| {
            err(
                ErrorKind::UnknownName,
                span,
                format!("`{v}` is not a day of the week"),
            )
            .help("days are MO, TU, WE, TH, FR, SA and SU")
        })
}

fn by_day(v: &str, span: Span) -> Result<Vec<(i8, u8)>, ParseError> {
    let mut out = Vec::new();
    let mut pos = span.start;
    for item in v.split(',') {
        let ispan = Span::new(pos, pos + item.len());
        pos += item.len() + 1;
        if item.len() < 2 {
            return Err(err(ErrorKind::UnknownName, ispan, format!("`{item}` is not a day of the week"))
                .help("days are MO, TU, WE, TH, FR, SA and SU, with an optional position such as `1MO` or `-1FR`"));
        }
        let (num, name) = item.split_at(item.len() - 2);
        let numeric = num
            .strip_prefix(['+', '-'])
            .unwrap_or(num)
            .bytes()
            .all(|b| b.is_ascii_digit());
        let wd = day_name(
            name,
            if numeric {
                Span::new(ispan.end - 2, ispan.end)
            } else {
                ispan
            },
        )
        .and_then(|wd| {
            if numeric {
                Ok(wd)
            } else {
                day_name(item, ispan)
            }
        })?;
        let n = if num.is_empty() {
            0
        } else {
            let digits = num.strip_prefix(['+', '-']).unwrap_or(num);
            let n = number(
                digits,
                Span::new(ispan.start, ispan.end - 2),
                1,
                53,
                "a BYDAY position",
            )?;
            if num.starts_with('-') { -n } else { n }
        };
        out.push((n as i8, wd));
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The last day the search looks at, and the first.
fn max_day() -> i64 {
    days_from_civil(MAX_YEAR, 12, 31)
}
fn min_day() -> i64 {
    days_from_civil(MIN_YEAR, 1, 1)
}

/// Monday-based weekday (0 = Monday).
fn mon0(day: i64) -> u8 {
    (weekday(day) + 6) % 7
}

fn ones(bits: u64) -> u32 {
    bits.count_ones()
}

/// The `k`-th set bit (0-based).
fn nth_bit(bits: u64, k: u32) -> u32 {
    let mut b = bits;
    for _ in 0..k {
        b &= b - 1;
    }
    b.trailing_zeros()
}

fn next_bit(bits: u64, from: u32) -> Option<u32> {
    if from >= 64 {
        return None;
    }
    let b = bits >> from << from;
    (b != 0).then(|| b.trailing_zeros())
}

fn prev_bit(bits: u64, from: i32) -> Option<u32> {
    if from < 0 {
        return None;
    }
    let b = if from >= 63 {
        bits
    } else {
        bits & ((2u64 << from) - 1)
    };
    (b != 0).then(|| 63 - b.leading_zeros())
}

/// The first day of the week (starting on `wkst`) that holds `day`.
fn week_start(day: i64, wkst: u8) -> i64 {
    day - i64::from((mon0(day) + 7 - wkst) % 7)
}

/// The first day of week 1 of `year`: the week holding January 4th.
fn week1(year: i32, wkst: u8) -> i64 {
    week_start(days_from_civil(year, 1, 4), wkst)
}

impl Rrule {
    /// Readies the rule for searching in a zone: applies the defaults that
    /// come from `DTSTART`, turns times written in UTC into the zone's wall
    /// clock, and turns `COUNT` into the last time the rule produces.
    pub(crate) fn compile(&mut self, tz: &jiff::tz::TimeZone) -> Result<(), ParseError> {
        let wall = |w: When| -> i64 {
            match w {
                When::Local(c) | When::Date(c) => c,
                When::Utc(u) => {
                    let ts = jiff::Timestamp::from_second(u).expect("parsed dates are in range");
                    let off = tz.to_offset(ts).seconds();
                    u + i64::from(off)
                }
            }
        };
        if let Some(When::Utc(u)) = self.dtstart_written {
            self.dtstart = wall(When::Utc(u));
        }
        let start = self.dtstart;
        let (h0, m0, s0) = (
            (start.rem_euclid(DAY) / 3600) as u32,
            (start.rem_euclid(3600) / 60) as u32,
            start.rem_euclid(60) as u32,
        );
        let f = self.freq;
        let or = |given: u64, default: u32, limit_from: Freq| -> u64 {
            if given != 0 {
                given
            } else if f < limit_from {
                1 << default
            } else {
                u64::MAX
            }
        };
        let mut c = Compiled {
            hours: or(u64::from(self.by_hour), h0, Freq::Hourly) as u32 & 0x00ff_ffff,
            minutes: or(self.by_minute, m0, Freq::Minutely) & ((1 << 60) - 1),
            seconds: or(self.by_second, s0, Freq::Secondly) & ((1 << 60) - 1),
            ..Compiled::default()
        };
        // Days: without any day part, YEARLY, MONTHLY and WEEKLY take
        // DTSTART's day (and month, for YEARLY).
        let no_day_parts = self.monthdays.is_empty()
            && self.yeardays.is_empty()
            && self.weeknos.is_empty()
            && self.weekdays.is_empty();
        let (_, smonth, sday) = civil_from_days(start.div_euclid(DAY));
        let mut derived = self.clone();
        if no_day_parts {
            match f {
                Freq::Yearly => {
                    if derived.months == 0 {
                        derived.months = 1 << smonth;
                    }
                    derived.monthdays = vec![sday as i8];
                }
                Freq::Monthly => derived.monthdays = vec![sday as i8],
                Freq::Weekly => derived.weekdays = vec![(0, mon0(start.div_euclid(DAY)))],
                _ => {}
            }
        }
        self.months = derived.months;
        self.monthdays = derived.monthdays;
        self.weekdays = derived.weekdays;
        if f.sub_daily() {
            // What one period holds: for HOURLY the minutes and seconds, for
            // MINUTELY the seconds, for SECONDLY the second itself.
            let mut inner: Vec<u32> = match f {
                Freq::Hourly => (0..ones(c.minutes))
                    .flat_map(|m| {
                        let m = nth_bit(c.minutes, m);
                        (0..ones(c.seconds)).map(move |s| (m, s))
                    })
                    .map(|(m, s)| m * 60 + nth_bit(c.seconds, s))
                    .collect(),
                Freq::Minutely => (0..ones(c.seconds))
                    .map(|s| nth_bit(c.seconds, s))
                    .collect(),
                _ => vec![0],
            };
            if !self.setpos.is_empty() {
                inner = pick(&inner, &self.setpos);
            }
            c.inner = inner;
        }
        c.chunk0 = self.chunk_index(start.div_euclid(DAY));
        c.unit0 = start.div_euclid(f.unit());
        for w in &self.exdates {
            match w {
                When::Date(d) => c.exdays.push(d.div_euclid(DAY)),
                w => c.exdates.push(wall(*w)),
            }
        }
        c.exdates.sort_unstable();
        c.exdates.dedup();
        c.exdays.sort_unstable();
        c.exdays.dedup();
        // A date alone adds a time at DTSTART's time of day.
        c.rdates = self
            .rdates
            .iter()
            .map(|w| match w {
                When::Date(d) => d + start.rem_euclid(DAY),
                w => wall(*w),
            })
            .collect();
        c.rdates.sort_unstable();
        c.rdates.dedup();
        match self.until {
            Some(When::Utc(u)) => c.end = Some(wall(When::Utc(u))),
            Some(When::Local(l)) => c.end = Some(l),
            Some(When::Date(d)) => c.end = Some(d + DAY - 1),
            None => {}
        }
        self.c = c;
        if f.sub_daily() {
            self.reduce_lattice();
        }
        if f.sub_daily() {
            self.check_alignment()?;
        }
        let c = &mut self.c;
        c.never = c.hours == 0
            || c.minutes == 0
            || c.seconds == 0
            || (f.sub_daily() && c.inner.is_empty());
        if f.sub_daily() && !self.lattice_reaches() {
            self.c.never = true;
        }
        // The rule's pattern repeats after its horizon: none there, none ever.
        // Knowing it keeps later searches from walking to year 9999.
        let horizon = start.saturating_add(self.horizon_days().saturating_mul(DAY));
        if !matches!(self.raw_next(start, horizon), Search::Found(_)) {
            self.c.never = true;
        }
        if let Some(count) = self.count {
            self.c.end = Some(self.nth_time(count).unwrap_or(start - 1));
        }
        if matches!(
            crate::civil::CivilSet::next(self, i64::MIN / 4, i64::MAX),
            Search::Exhausted
        ) {
            return Err(err(ErrorKind::NeverFires, self.span, "the rule never produces a time")
                .help("check its BY parts against each other, against INTERVAL and DTSTART, and UNTIL against DTSTART"));
        }
        Ok(())
    }

    /// A span after which the rule's pattern repeats: a multiple of both the
    /// Gregorian calendar's 400 years (146,097 days, exactly 20,871 weeks)
    /// and the rule's lattice of periods.
    fn horizon_days(&self) -> i64 {
        let i = i128::from(self.interval);
        let lcm = |a: i128, b: i128| a / i128::from(gcd(a as i64, b as i64)) * b;
        let days: i128 = match self.freq {
            Freq::Yearly => lcm(400, i) / 400 * 146_097,
            Freq::Monthly => lcm(4800, i) / 4800 * 146_097,
            Freq::Weekly => lcm(20_871, i) * 7,
            Freq::Daily => lcm(146_097, i),
            f => {
                let per_day = i128::from(DAY / f.unit());
                lcm(146_097 * per_day, i) / per_day
            }
        };
        // Past year 9999 the search stops anyway.
        days.min(i128::from(max_day() - min_day())) as i64 + 1
    }

    /// The `n`-th time the rule produces from DTSTART (for COUNT), or its
    /// last if it produces fewer. With BYSETPOS over whole periods, a
    /// period's set is built once, not once per time.
    fn nth_time(&self, n: u32) -> Option<i64> {
        let start = self.dtstart;
        let mut last = None;
        let mut left = n;
        if !self.freq.sub_daily() && !self.setpos.is_empty() {
            if self.c.never {
                return None;
            }
            let mut idx = self.chunk_index(start.div_euclid(DAY));
            while self.chunk_days(idx).0 <= max_day() {
                for x in self.period_set(idx).into_iter().filter(|x| *x >= start) {
                    last = Some(x);
                    left -= 1;
                    if left == 0 {
                        return last;
                    }
                }
                idx += self.step();
            }
            return last;
        }
        let mut at = start;
        while left > 0 {
            let Search::Found(x) = self.raw_next(at, i64::MAX) else {
                break;
            };
            last = Some(x);
            left -= 1;
            at = x + 1;
        }
        last
    }

    /// Sub-daily: the period starts of a day the hour, minute and second
    /// parts allow, as indices of the frequency's unit in the day.
    fn allowed_periods(&self) -> impl Iterator<Item = i64> + '_ {
        let c = &self.c;
        let (hours, minutes, seconds) =
            (bits(u64::from(c.hours)), bits(c.minutes), bits(c.seconds));
        let f = self.freq;
        hours.into_iter().flat_map(move |h| {
            let minutes = if f >= Freq::Minutely {
                minutes.clone()
            } else {
                vec![0]
            };
            let seconds = seconds.clone();
            minutes.into_iter().flat_map(move |m| {
                let seconds = if f == Freq::Secondly {
                    seconds.clone()
                } else {
                    vec![0]
                };
                seconds
                    .into_iter()
                    .map(move |s| i64::from(h * 3600 + m * 60 + s) / f.unit())
            })
        })
    }

    /// Sub-daily: whether some allowed period start falls on the lattice
    /// on some day. On day d the lattice holds the periods congruent to
    /// DTSTART's minus d times the periods of a day, modulo INTERVAL; over
    /// all days, exactly those congruent to DTSTART's modulo g =
    /// gcd(INTERVAL, periods a day).
    fn lattice_reaches(&self) -> bool {
        let g = gcd(i64::from(self.interval), DAY / self.freq.unit());
        let u0 = self.c.unit0.rem_euclid(g);
        self.allowed_periods().any(|p| p % g == u0)
    }

    /// Sub-daily rules whose allowed hours, minutes or seconds meet the
    /// lattice less than once a year are refused: each search would walk
    /// that far.
    fn check_alignment(&self) -> Result<(), ParseError> {
        let per_day = DAY / self.freq.unit();
        let interval = i64::from(self.interval);
        let g = gcd(interval, per_day);
        let days = interval / g;
        let u0 = self.c.unit0.rem_euclid(g);
        // The periods the lattice can reach that the parts allow: all of
        // them, and every period of the lattice fires (no search).
        let allowed = self.allowed_periods().filter(|p| p % g == u0).count() as i64;
        if days > 366 && allowed < per_day / g {
            return Err(err(
                ErrorKind::OutOfRange,
                self.span,
                format!(
                    "with INTERVAL={} the {} periods line up with the same time of day only every {days} days, so BYHOUR, BYMINUTE or BYSECOND would fire years apart",
                    self.interval,
                    self.freq.name().to_ascii_lowercase()
                ),
            )
            .help("use an INTERVAL that divides a day (or a small multiple of one), or drop BYHOUR, BYMINUTE and BYSECOND"));
        }
        Ok(())
    }

    /// Drops the hours, minutes or seconds that no period of a sub-daily
    /// lattice can reach: a day's periods are `DTSTART`'s plus multiples of
    /// INTERVAL, so only times congruent to DTSTART's modulo
    /// gcd(INTERVAL, periods a day) ever fall on it.
    fn reduce_lattice(&mut self) {
        let per_day = DAY / self.freq.unit();
        let g = gcd(i64::from(self.interval), per_day);
        if g == 1 {
            return;
        }
        let u0 = self.c.unit0.rem_euclid(g);
        let c = &mut self.c;
        match self.freq {
            Freq::Hourly => {
                c.hours &= (0..24)
                    .filter(|h| i64::from(*h) % g == u0)
                    .fold(0, |m, h| m | 1 << h)
            }
            Freq::Minutely if 60 % g == 0 => {
                c.minutes &= (0..60)
                    .filter(|m| i64::from(*m) % g == u0 % g)
                    .fold(0u64, |a, m| a | 1 << m)
            }
            Freq::Secondly if 60 % g == 0 => {
                c.seconds &= (0..60)
                    .filter(|s| i64::from(*s) % g == u0 % g)
                    .fold(0u64, |a, s| a | 1 << s)
            }
            _ => {}
        }
    }

    /// The index of the period (for YEARLY to DAILY) holding `day`.
    fn chunk_index(&self, day: i64) -> i64 {
        match self.freq {
            Freq::Yearly => i64::from(civil_from_days(day).0),
            Freq::Monthly => {
                let (y, m, _) = civil_from_days(day);
                i64::from(y) * 12 + i64::from(m) - 1
            }
            Freq::Weekly => (week_start(day, self.wkst) - week_start(0, self.wkst)) / 7,
            _ => day,
        }
    }

    /// First day and one past the last day of a period.
    fn chunk_days(&self, idx: i64) -> (i64, i64) {
        match self.freq {
            Freq::Yearly => {
                let y = idx.clamp(i64::from(MIN_YEAR) - 1, i64::from(MAX_YEAR) + 1) as i32;
                (days_from_civil(y, 1, 1), days_from_civil(y + 1, 1, 1))
            }
            Freq::Monthly => {
                let y = idx
                    .div_euclid(12)
                    .clamp(i64::from(MIN_YEAR) - 1, i64::from(MAX_YEAR) + 1)
                    as i32;
                let m = idx.rem_euclid(12) as u8 + 1;
                let s = days_from_civil(y, m, 1);
                (s, s + i64::from(days_in_month(y, m)))
            }
            Freq::Weekly => {
                let start = week_start(0, self.wkst) + idx * 7;
                (start, start + 7)
            }
            _ => (idx, idx + 1),
        }
    }
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a.abs() } else { gcd(b, a % b) }
}

/// `BYSETPOS`: the chosen positions (1-based, negative from the end) of a
/// sorted set, sorted.
fn pick<T: Copy + Ord>(set: &[T], setpos: &[i32]) -> Vec<T> {
    let n = set.len() as i64;
    let mut out: Vec<T> = setpos
        .iter()
        .filter_map(|&p| {
            let i = if p > 0 {
                i64::from(p) - 1
            } else {
                n + i64::from(p)
            };
            (0..n).contains(&i).then(|| set[i as usize])
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

impl Rrule {
    /// Whether a day passes the day parts (BYMONTH, BYWEEKNO, BYYEARDAY,
    /// BYMONTHDAY, BYDAY).
    fn day_ok(&self, day: i64) -> bool {
        let (y, m, d) = civil_from_days(day);
        if self.months != 0 && self.months & (1 << m) == 0 {
            return false;
        }
        let dim = i32::from(days_in_month(y, m));
        let d = i32::from(d);
        if !self.monthdays.is_empty()
            && !self.monthdays.iter().any(|&x| {
                let x = i32::from(x);
                x == d || dim + x + 1 == d
            })
        {
            return false;
        }
        if !self.yeardays.is_empty() {
            let len = if is_leap(y) { 366 } else { 365 };
            let yd = (day - days_from_civil(y, 1, 1)) as i32 + 1;
            if !self.yeardays.iter().any(|&x| {
                let x = i32::from(x);
                x == yd || len + x + 1 == yd
            }) {
                return false;
            }
        }
        if !self.weeknos.is_empty() {
            let (wn, weeks) = self.week_number(day, y);
            if !self.weeknos.iter().any(|&x| {
                let x = i32::from(x);
                x == wn || weeks + x + 1 == wn
            }) {
                return false;
            }
        }
        if !self.weekdays.is_empty() {
            let wd = mon0(day);
            let (lo, hi) = if self.freq == Freq::Monthly || self.months != 0 {
                let first = days_from_civil(y, m, 1);
                (first, first + i64::from(dim))
            } else {
                (days_from_civil(y, 1, 1), days_from_civil(y + 1, 1, 1))
            };
            let from_start = ((day - lo) / 7 + 1) as i32;
            let from_end = ((hi - 1 - day) / 7 + 1) as i32;
            if !self.weekdays.iter().any(|&(n, w)| {
                w == wd && (n == 0 || i32::from(n) == from_start || i32::from(n) == -from_end)
            }) {
                return false;
            }
        }
        true
    }

    /// The week number of `day` (in the year `y` it falls in) and how many
    /// weeks the year of that week has.
    fn week_number(&self, day: i64, y: i32) -> (i32, i32) {
        let (mut wy, mut start) = (y, week1(y, self.wkst));
        if day < start {
            wy = y - 1;
            start = week1(wy, self.wkst);
        } else {
            let next = week1(y + 1, self.wkst);
            if day >= next {
                wy = y + 1;
                start = next;
            }
        }
        let weeks = ((week1(wy + 1, self.wkst) - start) / 7) as i32;
        (((day - start) / 7 + 1) as i32, weeks)
    }

    /// The first time of day at or after `tod` on `day` (which passed the
    /// day parts).
    fn next_in_day(&self, day: i64, tod: u32) -> Option<u32> {
        let c = &self.c;
        let (mut h, mut m, mut s) = (tod / 3600, tod / 60 % 60, tod % 60);
        if !self.freq.sub_daily() {
            loop {
                let nh = next_bit(u64::from(c.hours), h)?;
                if nh != h {
                    (h, m, s) = (nh, 0, 0);
                }
                match next_bit(c.minutes, m) {
                    None => {
                        (h, m, s) = (h + 1, 0, 0);
                        continue;
                    }
                    Some(nm) if nm != m => (m, s) = (nm, 0),
                    _ => {}
                }
                match next_bit(c.seconds, s) {
                    None => (m, s) = (m + 1, 0),
                    Some(ns) => return Some(h * 3600 + m * 60 + ns),
                }
            }
        }
        let unit = self.freq.unit() as u32;
        let per_day = DAY as u32 / unit;
        let mut p = tod / unit;
        let mut lo = tod % unit;
        loop {
            if p >= per_day {
                return None;
            }
            let secs = p * unit;
            (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
            // The period must be one the hour (minute, second) parts allow.
            let nh = next_bit(u64::from(c.hours), h)?;
            let jump = if nh != h {
                Some(nh * 3600)
            } else if self.freq >= Freq::Minutely {
                match next_bit(c.minutes, m) {
                    None => Some((h + 1) * 3600),
                    Some(nm) if nm != m => Some(h * 3600 + nm * 60),
                    _ if self.freq == Freq::Secondly => match next_bit(c.seconds, s) {
                        None => Some(h * 3600 + (m + 1) * 60),
                        Some(ns) if ns != s => Some(h * 3600 + m * 60 + ns),
                        _ => None,
                    },
                    _ => None,
                }
            } else {
                None
            };
            if let Some(to) = jump {
                (p, lo) = (to / unit, 0);
                continue;
            }
            // And on the lattice: DTSTART's period plus multiples of INTERVAL.
            let u = day * i64::from(per_day) + i64::from(p);
            let r = (u - c.unit0).rem_euclid(i64::from(self.interval));
            if r != 0 {
                let ahead = i64::from(self.interval) - r;
                if ahead >= i64::from(per_day - p) {
                    return None;
                }
                (p, lo) = (p + ahead as u32, 0);
                continue;
            }
            let i = c.inner.partition_point(|&o| o < lo);
            if let Some(o) = c.inner.get(i) {
                return Some(secs + o);
            }
            (p, lo) = (p + 1, 0);
        }
    }

    /// The last time of day at or before `tod` on `day`.
    fn prev_in_day(&self, day: i64, tod: u32) -> Option<u32> {
        let c = &self.c;
        let (mut h, mut m, mut s) = (tod as i32 / 3600, tod as i32 / 60 % 60, tod as i32 % 60);
        if !self.freq.sub_daily() {
            loop {
                let ph = prev_bit(u64::from(c.hours), h)? as i32;
                if ph != h {
                    (h, m, s) = (ph, 59, 59);
                }
                match prev_bit(c.minutes, m) {
                    None => {
                        (h, m, s) = (h - 1, 59, 59);
                        continue;
                    }
                    Some(pm) if pm as i32 != m => (m, s) = (pm as i32, 59),
                    _ => {}
                }
                match prev_bit(c.seconds, s) {
                    None => (m, s) = (m - 1, 59),
                    Some(ps) => return Some((h * 3600 + m * 60) as u32 + ps),
                }
            }
        }
        let unit = self.freq.unit() as i32;
        let per_day = DAY as i32 / unit;
        let mut p = tod as i32 / unit;
        let mut hi = Some(tod % unit as u32);
        loop {
            if p < 0 {
                return None;
            }
            let secs = p * unit;
            (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
            let ph = prev_bit(u64::from(c.hours), h)? as i32;
            // One second before the start of the nearest allowed unit, or
            // the allowed unit itself.
            let jump = if ph != h {
                Some(ph * 3600 + 3599)
            } else if self.freq >= Freq::Minutely {
                match prev_bit(c.minutes, m) {
                    None => Some(h * 3600 - 1),
                    Some(pm) if pm as i32 != m => Some(h * 3600 + pm as i32 * 60 + 59),
                    _ if self.freq == Freq::Secondly => match prev_bit(c.seconds, s) {
                        None => Some(h * 3600 + m * 60 - 1),
                        Some(ps) if ps as i32 != s => Some(h * 3600 + m * 60 + ps as i32),
                        _ => None,
                    },
                    _ => None,
                }
            } else {
                None
            };
            if let Some(to) = jump {
                if to < 0 {
                    return None;
                }
                (p, hi) = (to / unit, None);
                continue;
            }
            let u = day * i64::from(per_day) + i64::from(p);
            let r = (u - c.unit0).rem_euclid(i64::from(self.interval));
            if r != 0 {
                if r > i64::from(p) {
                    return None;
                }
                (p, hi) = (p - r as i32, None);
                continue;
            }
            let i = match hi {
                Some(hi) => c.inner.partition_point(|&o| o <= hi),
                None => c.inner.len(),
            };
            if i > 0 {
                return Some(secs as u32 + c.inner[i - 1]);
            }
            (p, hi) = (p - 1, None);
        }
    }

    /// The periods step: INTERVAL for YEARLY to DAILY (sub-daily lattices
    /// are kept within the day).
    fn step(&self) -> i64 {
        if self.freq.sub_daily() {
            1
        } else {
            i64::from(self.interval)
        }
    }

    /// The times of one period of a YEARLY-to-DAILY rule with BYSETPOS.
    fn period_set(&self, idx: i64) -> Vec<i64> {
        let c = &self.c;
        let (start, end) = self.chunk_days(idx);
        let days: Vec<i64> = (start..end).filter(|d| self.day_ok(*d)).collect();
        let (nh, nm, ns) = (ones(u64::from(c.hours)), ones(c.minutes), ones(c.seconds));
        let per_day = i64::from(nh * nm * ns);
        let n = days.len() as i64 * per_day;
        let mut out: Vec<i64> = self
            .setpos
            .iter()
            .filter_map(|&p| {
                let i = if p > 0 {
                    i64::from(p) - 1
                } else {
                    n + i64::from(p)
                };
                if !(0..n).contains(&i) {
                    return None;
                }
                let k = (i % per_day) as u32;
                let h = nth_bit(u64::from(c.hours), k / (nm * ns));
                let m = nth_bit(c.minutes, k / ns % nm);
                let s = nth_bit(c.seconds, k % ns);
                Some(days[(i / per_day) as usize] * DAY + i64::from(h * 3600 + m * 60 + s))
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Moves `idx` onto the lattice of periods: forward or backward.
    fn on_lattice(&self, idx: i64, forward: bool) -> i64 {
        let r = (idx - self.c.chunk0).rem_euclid(self.step());
        match (r, forward) {
            (0, _) => idx,
            (r, true) => idx + self.step() - r,
            (r, false) => idx - r,
        }
    }

    /// Sub-daily: when no period of the lattice starts on `day` at or after
    /// `at`, the start of the next one (on a later day), so that days
    /// without one are skipped whole.
    fn next_lattice_day(&self, at: i64, day: i64) -> Option<i64> {
        if !self.freq.sub_daily() {
            return None;
        }
        let unit = self.freq.unit();
        let u = at.div_euclid(unit);
        let next = u + (self.c.unit0 - u).rem_euclid(i64::from(self.interval));
        (next.div_euclid(DAY / unit) > day).then(|| next.saturating_mul(unit))
    }

    /// Sub-daily: when no period of the lattice starts on `day` at or
    /// before `at`, the last second of the previous one (on an earlier day).
    fn prev_lattice_day(&self, at: i64, day: i64) -> Option<i64> {
        if !self.freq.sub_daily() {
            return None;
        }
        let unit = self.freq.unit();
        let u = at.div_euclid(unit);
        let prev = u - (u - self.c.unit0).rem_euclid(i64::from(self.interval));
        (prev.div_euclid(DAY / unit) < day).then(|| (prev + 1).saturating_mul(unit) - 1)
    }

    /// The rule's first civil second in `[from, limit)`, without EXDATE and RDATE.
    fn raw_next(&self, from: i64, limit: i64) -> Search {
        if self.c.never {
            return Search::Exhausted;
        }
        let end = self.c.end.unwrap_or(i64::MAX);
        let coarse_setpos = !self.freq.sub_daily() && !self.setpos.is_empty();
        let mut at = from.max(self.dtstart);
        loop {
            if at > end {
                return Search::Exhausted;
            }
            if at >= limit {
                return Search::Beyond;
            }
            let day = at.div_euclid(DAY);
            if day > max_day() {
                return Search::Exhausted;
            }
            if let Some(next) = self.next_lattice_day(at, day) {
                at = next;
                continue;
            }
            let idx = self.chunk_index(day);
            let lattice = self.on_lattice(idx, true);
            if lattice != idx {
                at = self.chunk_days(lattice).0 * DAY;
                continue;
            }
            let (_, chunk_end) = self.chunk_days(idx);
            let found = if coarse_setpos {
                self.period_set(idx).into_iter().find(|x| *x >= at)
            } else {
                let mut found = None;
                let mut tod = at.rem_euclid(DAY) as u32;
                for d in day..chunk_end {
                    if d * DAY >= limit {
                        return Search::Beyond;
                    }
                    if self.day_ok(d) {
                        if let Some(t) = self.next_in_day(d, tod) {
                            found = Some(d * DAY + i64::from(t));
                            break;
                        }
                    }
                    tod = 0;
                }
                found
            };
            match found {
                Some(x) if x > end => return Search::Exhausted,
                Some(x) if x >= limit => return Search::Beyond,
                Some(x) => return Search::Found(x),
                None => at = self.chunk_days(idx + self.step()).0 * DAY,
            }
        }
    }

    /// The rule's last civil second in `[limit, from]`, without EXDATE and RDATE.
    fn raw_prev(&self, from: i64, limit: i64) -> Search {
        if self.c.never {
            return Search::Exhausted;
        }
        let coarse_setpos = !self.freq.sub_daily() && !self.setpos.is_empty();
        let mut at = from
            .min(self.c.end.unwrap_or(i64::MAX))
            .min((max_day() + 1) * DAY - 1);
        loop {
            if at < self.dtstart {
                return Search::Exhausted;
            }
            if at < limit {
                return Search::Beyond;
            }
            let day = at.div_euclid(DAY);
            if day < min_day() {
                return Search::Exhausted;
            }
            if let Some(prev) = self.prev_lattice_day(at, day) {
                at = prev;
                continue;
            }
            let idx = self.chunk_index(day);
            let lattice = self.on_lattice(idx, false);
            if lattice != idx {
                at = self.chunk_days(lattice).1 * DAY - 1;
                continue;
            }
            let (chunk_start, _) = self.chunk_days(idx);
            let found = if coarse_setpos {
                self.period_set(idx).into_iter().rev().find(|x| *x <= at)
            } else {
                let mut found = None;
                let mut tod = at.rem_euclid(DAY) as u32;
                let mut d = day;
                while d >= chunk_start {
                    if (d + 1) * DAY - 1 < limit {
                        return Search::Beyond;
                    }
                    if self.day_ok(d) {
                        if let Some(t) = self.prev_in_day(d, tod) {
                            found = Some(d * DAY + i64::from(t));
                            break;
                        }
                    }
                    tod = DAY as u32 - 1;
                    d -= 1;
                }
                found
            };
            match found {
                Some(x) if x < self.dtstart => return Search::Exhausted,
                Some(x) if x < limit => return Search::Beyond,
                Some(x) => return Search::Found(x),
                None => at = chunk_start * DAY - 1,
            }
        }
    }
}

impl crate::civil::CivilSet for Rrule {
    /// The first civil second of the set (rule, RDATE, less EXDATE) in `[from, limit)`.
    fn next(&self, mut from: i64, limit: i64) -> Search {
        let c = &self.c;
        loop {
            let rule = self.raw_next(from, limit);
            let extra = c
                .rdates
                .get(c.rdates.partition_point(|&r| r < from))
                .copied();
            let found = match (rule, extra) {
                (Search::Found(x), Some(r)) => Search::Found(x.min(r)),
                (Search::Found(x), None) => Search::Found(x),
                (_, Some(r)) if r < limit => Search::Found(r),
                (Search::Exhausted, None) => Search::Exhausted,
                _ => Search::Beyond,
            };
            match found {
                Search::Found(x) if c.exdays.binary_search(&x.div_euclid(DAY)).is_ok() => {
                    from = (x.div_euclid(DAY) + 1) * DAY;
                }
                Search::Found(x) if c.exdates.binary_search(&x).is_ok() => from = x + 1,
                other => return other,
            }
        }
    }

    /// The last civil second of the set in `[limit, from]`.
    fn prev(&self, mut from: i64, limit: i64) -> Search {
        let c = &self.c;
        loop {
            let rule = self.raw_prev(from, limit);
            let i = c.rdates.partition_point(|&r| r <= from);
            let extra = i.checked_sub(1).map(|i| c.rdates[i]);
            let found = match (rule, extra) {
                (Search::Found(x), Some(r)) => Search::Found(x.max(r)),
                (Search::Found(x), None) => Search::Found(x),
                (_, Some(r)) if r >= limit => Search::Found(r),
                (Search::Exhausted, None) => Search::Exhausted,
                _ => Search::Beyond,
            };
            match found {
                Search::Found(x) if c.exdays.binary_search(&x.div_euclid(DAY)).is_ok() => {
                    from = x.div_euclid(DAY) * DAY - 1;
                }
                Search::Found(x) if c.exdates.binary_search(&x).is_ok() => from = x - 1,
                other => return other,
            }
        }
    }

    fn matches_civil(&self, secs: i64) -> bool {
        self.next(secs, secs + 1) == Search::Found(secs)
    }
}

fn two(n: i64) -> String {
    format!("{n:02}")
}

/// `YYYYMMDDTHHMMSS` (civil), with a `Z` for an instant, or `YYYYMMDD`.
fn fmt_when(w: When) -> String {
    let (secs, z) = match w {
        When::Local(c) => (c, ""),
        When::Utc(u) => (u, "Z"),
        When::Date(d) => {
            let (y, m, dd) = civil_from_days(d.div_euclid(DAY));
            return format!("{y:04}{}{}", two(m.into()), two(dd.into()));
        }
    };
    let (y, m, d) = civil_from_days(secs.div_euclid(DAY));
    let t = secs.rem_euclid(DAY);
    format!(
        "{y:04}{}{}T{}{}{}{z}",
        two(m.into()),
        two(d.into()),
        two(t / 3600),
        two(t / 60 % 60),
        two(t % 60)
    )
}

fn list(values: impl IntoIterator<Item = String>) -> String {
    values.into_iter().collect::<Vec<_>>().join(",")
}

fn bits(mask: u64) -> Vec<u32> {
    (0..64).filter(|b| mask & (1 << b) != 0).collect()
}

fn day_spec(n: i8, wd: u8) -> String {
    if n == 0 {
        DAYS[usize::from(wd)].to_string()
    } else {
        format!("{n}{}", DAYS[usize::from(wd)])
    }
}

impl Rrule {
    /// The normal form: a `DTSTART` line (with the zone given, if any), the
    /// rule with its parts in one order, then `EXDATE` and `RDATE` lines,
    /// times and dates apart, sorted. It is never longer than the longest
    /// text the parser takes from at most [`MAX_DATES`] values.
    pub(crate) fn normalized(&self, zone: Option<&str>) -> String {
        let tz = zone.map(|z| format!(";TZID={z}")).unwrap_or_default();
        let mut out = match self.dtstart_written {
            Some(w @ When::Date(_)) => format!("DTSTART{tz};VALUE=DATE:{}", fmt_when(w)),
            Some(When::Utc(u)) => format!("DTSTART:{}", fmt_when(When::Utc(u))),
            Some(w) => format!("DTSTART{tz}:{}", fmt_when(w)),
            None => format!("DTSTART{tz}:{}", fmt_when(When::Local(self.dtstart))),
        };
        let mut parts = vec![format!("FREQ={}", self.freq.name())];
        if self.interval != 1 {
            parts.push(format!("INTERVAL={}", self.interval));
        }
        if let Some(n) = self.count {
            parts.push(format!("COUNT={n}"));
        }
        if let Some(u) = self.until {
            parts.push(format!("UNTIL={}", fmt_when(u)));
        }
        let mut push = |name: &str, values: Vec<String>| {
            if !values.is_empty() {
                parts.push(format!("{name}={}", list(values)));
            }
        };
        fn texts<T: ToString>(values: impl IntoIterator<Item = T>) -> Vec<String> {
            values.into_iter().map(|v| v.to_string()).collect()
        }
        push("BYMONTH", texts(bits(u64::from(self.months))));
        push("BYWEEKNO", texts(&self.weeknos));
        push("BYYEARDAY", texts(&self.yeardays));
        push("BYMONTHDAY", texts(&self.monthdays));
        push(
            "BYDAY",
            texts(self.weekdays.iter().map(|(n, w)| day_spec(*n, *w))),
        );
        push("BYHOUR", texts(bits(u64::from(self.by_hour))));
        push("BYMINUTE", texts(bits(self.by_minute)));
        push("BYSECOND", texts(bits(self.by_second)));
        push("BYSETPOS", texts(&self.setpos));
        if self.wkst != 0 {
            parts.push(format!("WKST={}", DAYS[usize::from(self.wkst)]));
        }
        out.push_str(&format!("\nRRULE:{}", parts.join(";")));
        // EXDATE and RDATE lines carry the zone unless DTSTART is in UTC
        // (then their wall times are UTC's, and a TZID is refused).
        let tz = if matches!(self.dtstart_written, Some(When::Utc(_))) {
            String::new()
        } else {
            tz
        };
        for (name, dates) in [("EXDATE", &self.exdates), ("RDATE", &self.rdates)] {
            let mut dates = dates.clone();
            dates.sort_by_key(|w| match w {
                When::Local(c) | When::Date(c) | When::Utc(c) => *c,
            });
            dates.dedup();
            let (days, times): (Vec<When>, Vec<When>) =
                dates.into_iter().partition(|w| matches!(w, When::Date(_)));
            if !times.is_empty() {
                out.push_str(&format!(
                    "\n{name}{tz}:{}",
                    list(times.into_iter().map(fmt_when))
                ));
            }
            if !days.is_empty() {
                out.push_str(&format!(
                    "\n{name}{tz};VALUE=DATE:{}",
                    list(days.into_iter().map(fmt_when))
                ));
            }
        }
        out
    }

    /// English for a compiled rule, without the zone.
    pub(crate) fn explain(&self) -> String {
        use crate::explain::{MONTH_NAMES, WEEKDAY_NAMES, join, ordinal};
        let unit = ["year", "month", "week", "day", "hour", "minute", "second"][self.freq as usize];
        let mut out = if self.interval == 1 {
            format!("every {unit}")
        } else {
            format!("every {} {unit}s", self.interval)
        };
        let nth = |n: i32, what: &str| -> String {
            match n {
                -1 => format!("the last {what}"),
                n if n < 0 => format!("the {} to last {what}", ordinal(n.unsigned_abs())),
                n => format!("the {} {what}", ordinal(n as u32)),
            }
        };
        let weekday = |w: u8| WEEKDAY_NAMES[usize::from((w + 1) % 7)].to_string();
        let scope = if self.freq == Freq::Monthly || self.months != 0 {
            "month"
        } else {
            "year"
        };
        let mut days = Vec::new();
        if !self.weekdays.is_empty() {
            days.push(join(
                &self
                    .weekdays
                    .iter()
                    .map(|&(n, w)| {
                        if n == 0 {
                            weekday(w)
                        } else {
                            format!("{} of the {scope}", nth(i32::from(n), &weekday(w)))
                        }
                    })
                    .collect::<Vec<_>>(),
            ));
        }
        if !self.monthdays.is_empty() {
            let named: Vec<String> = self
                .monthdays
                .iter()
                .map(|&d| nth(i32::from(d), "day"))
                .collect();
            days.push(format!("{} of the month", join(&named)));
        }
        if !self.yeardays.is_empty() {
            let named: Vec<String> = self
                .yeardays
                .iter()
                .map(|&d| nth(i32::from(d), "day"))
                .collect();
            days.push(format!("{} of the year", join(&named)));
        }
        if !days.is_empty() {
            out.push_str(&format!(" on {}", days.join(", when also ")));
        }
        if !self.weeknos.is_empty() {
            let named: Vec<String> = self
                .weeknos
                .iter()
                .map(|&w| nth(i32::from(w), "week"))
                .collect();
            out.push_str(&format!(", in {} of the year", join(&named)));
        }
        if self.months != 0 {
            let named: Vec<String> = bits(u64::from(self.months))
                .iter()
                .map(|m| MONTH_NAMES[*m as usize - 1].to_string())
                .collect();
            out.push_str(&format!(", in {}", join(&named)));
        }
        let c = &self.c;
        let (hours, minutes, seconds) =
            (bits(u64::from(c.hours)), bits(c.minutes), bits(c.seconds));
        if !self.freq.sub_daily() && hours.len() * minutes.len() * seconds.len() <= 6 {
            let mut times = Vec::new();
            for h in &hours {
                for m in &minutes {
                    for s in &seconds {
                        times.push(if *s == 0 {
                            format!("{h:02}:{m:02}")
                        } else {
                            format!("{h:02}:{m:02}:{s:02}")
                        });
                    }
                }
            }
            out.push_str(&format!(" at {}", join(&times)));
        } else {
            let field = |name: &str, v: &[u32], all: usize| -> Option<String> {
                (v.len() < all).then(|| {
                    format!(
                        "{name} {}",
                        join(&v.iter().map(u32::to_string).collect::<Vec<_>>())
                    )
                })
            };
            let parts: Vec<String> = [
                field("hour", &hours, 24),
                field("minute", &minutes, 60),
                field("second", &seconds, 60),
            ]
            .into_iter()
            .flatten()
            .collect();
            if !parts.is_empty() {
                out.push_str(&format!(", at {}", join(&parts)));
            }
        }
        if !self.setpos.is_empty() {
            let named: Vec<String> = self
                .setpos
                .iter()
                .map(|&p| match p {
                    -1 => "the last".to_string(),
                    1 => "the first".to_string(),
                    p if p < 0 => format!("the {} to last", ordinal(p.unsigned_abs())),
                    p => format!("the {}", ordinal(p as u32)),
                })
                .collect();
            out.push_str(&format!(", only {} of each {unit}'s times", join(&named)));
        }
        if let Some(w) = self.dtstart_written {
            out.push_str(&format!(", from {}", fmt_iso(w)));
        }
        if let Some(n) = self.count {
            out.push_str(&format!(", {n} time{}", if n == 1 { "" } else { "s" }));
        }
        if let Some(u) = self.until {
            out.push_str(&format!(", until {}", fmt_iso(u)));
        }
        let (ex, rd) = (self.exdates.len(), self.rdates.len());
        if ex > 0 {
            out.push_str(&format!(
                ", except {ex} date{}",
                if ex == 1 { "" } else { "s" }
            ));
        }
        if rd > 0 {
            out.push_str(&format!(
                ", and on {rd} more date{}",
                if rd == 1 { "" } else { "s" }
            ));
        }
        out
    }
}

/// `2026-01-05 09:00:00` (or with a `Z`, or a date alone).
fn fmt_iso(w: When) -> String {
    let s = fmt_when(w);
    let b = &s;
    if b.len() == 8 {
        return format!("{}-{}-{}", &b[0..4], &b[4..6], &b[6..8]);
    }
    format!(
        "{}-{}-{} {}:{}:{}{}",
        &b[0..4],
        &b[4..6],
        &b[6..8],
        &b[9..11],
        &b[11..13],
        &b[13..15],
        if b.ends_with('Z') { " UTC" } else { "" }
    )
}
