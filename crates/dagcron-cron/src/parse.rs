//! The parser: text to [`Ast`], strict, with spans and suggestions.
//!
//! It works on bytes (the language is ASCII) and allocates once, for the list
//! of items, so that parsing stays in the same league as the fastest parsers
//! that keep no spans.

use crate::ast::{Ast, Body, Descriptor, FieldKind, Item, ItemKind, Slot, StepBase};
use crate::error::{ErrorKind, ParseError, Span};

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
const DESCRIPTORS: [&str; 10] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@midnight",
    "@hourly",
    "@every",
    "@at",
    "@reboot",
];
const FIELD_COUNTS: &str = "5 fields (minute hour day-of-month month day-of-week), 6 fields \
    (second first) or 7 fields (second first, year last)";

/// The longest expression accepted, in bytes. The longest useful one
/// (every field a full list of its values) is well under it; the bound keeps
/// every list within what the syntax tree can index and parsing cheap.
pub const MAX_EXPRESSION_LEN: usize = 1024;

/// Parses `src`. `seed` resolves `H`.
pub(crate) fn parse(src: &str, seed: u64) -> Result<Ast, ParseError> {
    if src.len() > MAX_EXPRESSION_LEN {
        return Err(ParseError::new(
            ErrorKind::TooLong,
            Span::new(MAX_EXPRESSION_LEN, src.len()),
            format!(
                "the expression is {} bytes long; at most {MAX_EXPRESSION_LEN} are accepted",
                src.len()
            ),
        )
        .help("use ranges and steps (`0-30/5`) instead of long lists"));
    }
    check_ascii(src)?;
    let bytes = src.as_bytes();
    let is_ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let start = bytes.iter().position(|b| !is_ws(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !is_ws(b))
        .map_or(start, |p| p + 1);
    if start == end {
        return Err(ParseError::new(ErrorKind::Empty, Span::new(0, src.len()), "the expression is empty")
            .help("write 5 to 7 fields, such as `*/5 * * * *` (every 5 minutes), or a descriptor such as `@daily`"));
    }
    let mut pos = start;
    let mut time_zone = None;
    for prefix in ["CRON_TZ=", "TZ="] {
        if bytes[pos..end].starts_with(prefix.as_bytes()) {
            let name_start = pos + prefix.len();
            let name_end = next_ws(bytes, name_start, end);
            let span = Span::new(name_start, name_end);
            if name_start == name_end {
                return Err(ParseError::new(
                    ErrorKind::TimeZone,
                    Span::new(pos, name_end),
                    "the time zone prefix names no zone",
                )
                .help("write an IANA zone such as `CRON_TZ=Europe/Berlin 0 9 * * *`"));
            }
            let name = &src[name_start..name_end];
            crate::zone::lookup(name, span)?;
            time_zone = Some((name.to_owned(), span));
            pos = skip_ws(bytes, name_end, end);
            if pos == end {
                return Err(ParseError::new(
                    ErrorKind::Empty,
                    Span::new(end, end),
                    "expected a cron expression after the time zone",
                )
                .help(format!("for example `{} 0 9 * * *`", &src[start..name_end])));
            }
            break;
        }
    }
    let body = if bytes[pos] == b'@' {
        parse_descriptor(src, pos, end, seed)?
    } else {
        parse_fields(src, pos, end, seed, None)?
    };
    Ok(Ast { time_zone, body })
}

pub(crate) fn check_ascii(src: &str) -> Result<(), ParseError> {
    if src.is_ascii()
        && !src
            .bytes()
            .any(|b| b.is_ascii_control() && !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        return Ok(());
    }
    let (i, ch) = src
        .char_indices()
        .find(|&(_, c)| {
            !c.is_ascii() || (c.is_ascii_control() && !matches!(c, ' ' | '\t' | '\n' | '\r'))
        })
        .expect("a non-ASCII or control character exists");
    let span = Span::new(i, i + ch.len_utf8());
    let err = ParseError::new(
        if ch.is_ascii() {
            ErrorKind::UnexpectedChar
        } else {
            ErrorKind::NonAscii
        },
        span,
        format!(
            "character {:?} (U+{:04X}) is not allowed: cron expressions are plain ASCII",
            ch, ch as u32
        ),
    );
    Err(match ch {
        '\u{a0}' | '\u{2000}'..='\u{200b}' | '\u{202f}' | '\u{3000}' => err.help("replace it with a plain space"),
        '\u{2010}'..='\u{2015}' | '\u{2212}' => err.help("replace it with a plain hyphen `-`"),
        '\u{ff0a}' | '\u{2217}' => err.help("replace it with a plain asterisk `*`"),
        '\u{ff0c}' | '\u{3001}' => err.help("replace it with a plain comma `,`"),
        _ => err.help("fields are separated by spaces or tabs and use digits, `* , - / ? # L W H` and English month or weekday names"),
    })
}

/// The end of a word: fields are separated by spaces or tabs only.
fn next_ws(bytes: &[u8], mut i: usize, end: usize) -> usize {
    while i < end && !matches!(bytes[i], b' ' | b'\t') {
        i += 1;
    }
    i
}

fn skip_ws(bytes: &[u8], mut i: usize, end: usize) -> usize {
    while i < end && matches!(bytes[i], b' ' | b'\t') {
        i += 1;
    }
    i
}

fn parse_descriptor(src: &str, pos: usize, end: usize, seed: u64) -> Result<Body, ParseError> {
    let bytes = src.as_bytes();
    let word_end = next_ws(bytes, pos, end);
    let word = &src[pos..word_end];
    let span = Span::new(pos, word_end);
    let lower = word.to_ascii_lowercase();
    let (expansion, descriptor) = match lower.as_str() {
        "@yearly" | "@annually" => ("0 0 0 1 1 *", Descriptor::Yearly),
        "@monthly" => ("0 0 0 1 * *", Descriptor::Monthly),
        "@weekly" => ("0 0 0 * * 0", Descriptor::Weekly),
        "@daily" | "@midnight" => ("0 0 0 * * *", Descriptor::Daily),
        "@hourly" => ("0 0 * * * *", Descriptor::Hourly),
        "@every" => return parse_every(src, word_end, end, span),
        "@at" => return parse_at(src, word_end, end, span),
        "@reboot" => {
            return Err(ParseError::new(ErrorKind::Descriptor, span, "`@reboot` is not a schedule: a dagcron job does not belong to one machine's boot")
                .help("trigger the job through the API or `dagcron jobs trigger` when your service starts"));
        }
        _ => {
            let err = ParseError::new(
                ErrorKind::Descriptor,
                span,
                format!("unknown descriptor `{word}`"),
            );
            return Err(match closest(&lower, DESCRIPTORS.iter().copied().filter(|d| *d != "@reboot")) {
                Some(best) => err.help(format!("did you mean `{best}`?")),
                None => err.help("accepted: @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly, @every <duration>, @at <instant>"),
            });
        }
    };
    let rest = skip_ws(bytes, word_end, end);
    if rest < end {
        return Err(ParseError::new(
            ErrorKind::UnexpectedChar,
            Span::new(rest, end),
            format!("unexpected text after `{word}`"),
        )
        .help(format!("`{word}` stands alone; remove what follows it")));
    }
    let Body::Fields {
        count,
        mut slots,
        mut items,
        ..
    } = parse_fields(expansion, 0, expansion.len(), seed, None)?
    else {
        unreachable!("an expansion is made of fields")
    };
    for slot in &mut slots {
        slot.span = span;
    }
    for item in &mut items {
        item.span = span;
    }
    Ok(Body::Fields {
        count,
        slots,
        items,
        descriptor: Some(descriptor),
    })
}

fn parse_every(
    src: &str,
    word_end: usize,
    end: usize,
    word_span: Span,
) -> Result<Body, ParseError> {
    let bytes = src.as_bytes();
    let start = skip_ws(bytes, word_end, end);
    if start == end {
        return Err(
            ParseError::new(ErrorKind::Duration, word_span, "`@every` needs a duration")
                .help("for example `@every 90s`, `@every 5m` or `@every 1h30m`"),
        );
    }
    let dur_end = next_ws(bytes, start, end);
    let span = Span::new(start, dur_end);
    if skip_ws(bytes, dur_end, end) < end {
        return Err(ParseError::new(
            ErrorKind::UnexpectedChar,
            Span::new(skip_ws(bytes, dur_end, end), end),
            "unexpected text after the duration",
        )
        .help("write the duration without spaces, such as `@every 1h30m`"));
    }
    let seconds = parse_duration_secs(&src[start..dur_end], start)?;
    Ok(Body::Every { seconds, span })
}

/// `@at <instant>`: one fire at an RFC 3339 instant with its offset, on a
/// whole second.
fn parse_at(src: &str, word_end: usize, end: usize, word_span: Span) -> Result<Body, ParseError> {
    let bytes = src.as_bytes();
    let start = skip_ws(bytes, word_end, end);
    let example = "for example `@at 2027-01-15T09:30:00Z` or `@at 2027-01-15T09:30:00+01:00`";
    if start == end {
        return Err(
            ParseError::new(ErrorKind::Instant, word_span, "`@at` needs an instant").help(example),
        );
    }
    let text_end = next_ws(bytes, start, end);
    let span = Span::new(start, text_end);
    if skip_ws(bytes, text_end, end) < end {
        return Err(ParseError::new(
            ErrorKind::UnexpectedChar,
            Span::new(skip_ws(bytes, text_end, end), end),
            "unexpected text after the instant",
        )
        .help("write the instant without spaces, with a `T` between date and time"));
    }
    let text = &src[start..text_end];
    let at: jiff::Timestamp = text.parse().map_err(|_| {
        ParseError::new(
            ErrorKind::Instant,
            span,
            format!("`{text}` is not an RFC 3339 instant with its offset"),
        )
        .help(example)
    })?;
    if at.subsec_nanosecond() != 0 {
        return Err(ParseError::new(
            ErrorKind::Instant,
            span,
            "`@at` fires on whole seconds; fractions of a second are not supported",
        )
        .help("drop the fraction of the second"));
    }
    Ok(Body::At {
        second: at.as_second(),
        span,
    })
}

/// Parses `1h30m`-style durations in whole seconds (units d, h, m, s).
fn parse_duration_secs(text: &str, offset: usize) -> Result<i64, ParseError> {
    let bytes = text.as_bytes();
    let whole = Span::new(offset, offset + text.len());
    let bad = |at: usize, len: usize, msg: String| {
        ParseError::new(
            ErrorKind::Duration,
            Span::new(offset + at, offset + at + len.max(1)),
            msg,
        )
        .help("write whole seconds or more with units d, h, m, s, such as `90s`, `5m` or `1h30m`")
    };
    let mut i = 0;
    let mut total: i64 = 0;
    while i < bytes.len() {
        let num_start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if i == num_start {
            return Err(bad(i, 1, format!("expected a number in duration `{text}`")));
        }
        let n: i64 = text[num_start..i]
            .parse()
            .map_err(|_| bad(num_start, i - num_start, "number too large".into()))?;
        let unit_start = i;
        while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
            i += 1;
        }
        let unit = &text[unit_start..i];
        let scale = match unit {
            "d" => 86_400,
            "h" => 3600,
            "m" => 60,
            "s" => 1,
            "ms" | "us" | "µs" | "ns" => {
                return Err(ParseError::new(
                    ErrorKind::Duration,
                    whole,
                    "`@every` fires on whole seconds; sub-second periods are not supported",
                )
                .help("use a period of at least `1s`"));
            }
            "" => {
                return Err(bad(
                    num_start,
                    i - num_start,
                    format!("the number {n} has no unit"),
                ));
            }
            _ => {
                return Err(bad(
                    unit_start,
                    i - unit_start,
                    format!("unknown duration unit `{unit}`"),
                ));
            }
        };
        total = n
            .checked_mul(scale)
            .and_then(|v| total.checked_add(v))
            .filter(|v| *v <= 100 * 366 * 86_400)
            .ok_or_else(|| {
                ParseError::new(
                    ErrorKind::Duration,
                    whole,
                    "the period is longer than 100 years",
                )
            })?;
    }
    if total == 0 {
        return Err(ParseError::new(
            ErrorKind::Duration,
            whole,
            "the period must be at least one second",
        )
        .help("for example `@every 1s`"));
    }
    Ok(total)
}

fn parse_fields(
    src: &str,
    pos: usize,
    end: usize,
    seed: u64,
    _: Option<()>,
) -> Result<Body, ParseError> {
    let bytes = src.as_bytes();
    let mut spans = [Span::new(0, 0); 8];
    let mut count = 0;
    let mut i = pos;
    while i < end {
        let field_end = next_ws(bytes, i, end);
        if count == 8 {
            break;
        }
        spans[count] = Span::new(i, field_end);
        count += 1;
        i = skip_ws(bytes, field_end, end);
    }
    if !(5..=7).contains(&count) {
        let (span, msg) = if count > 7 {
            (
                Span::new(spans[7].start, end),
                format!(
                    "too many fields: found {}, expected 5, 6 or 7",
                    count_all(bytes, pos, end)
                ),
            )
        } else {
            (
                Span::new(pos, end),
                format!("expected 5, 6 or 7 fields, found {count}"),
            )
        };
        let mut err = ParseError::new(ErrorKind::FieldCount, span, msg);
        err.suggestion = Some(format!("accepted: {FIELD_COUNTS}"));
        return Err(err);
    }
    let kinds: &[FieldKind] = match count {
        5 => &FieldKind::ALL[1..6],
        6 => &FieldKind::ALL[..6],
        _ => &FieldKind::ALL,
    };
    let mut items = Vec::with_capacity(count + 2);
    let empty = Slot {
        span: Span::new(pos, pos),
        start: 0,
        len: 0,
        written: false,
    };
    let mut slots = [empty; 7];
    for (kind, span) in kinds.iter().zip(&spans) {
        let start = items.len() as u16;
        parse_field(src, *kind, *span, seed, &mut items)?;
        slots[kind.index()] = Slot {
            span: *span,
            start,
            len: items.len() as u16 - start,
            written: true,
        };
    }
    if count == 5 {
        slots[0] = Slot {
            span: Span::new(pos, pos),
            start: items.len() as u16,
            len: 1,
            written: false,
        };
        items.push(Item {
            span: slots[0].span,
            kind: ItemKind::Value(0),
        });
    }
    if count < 7 {
        slots[6] = Slot {
            span: Span::new(end, end),
            start: items.len() as u16,
            len: 1,
            written: false,
        };
        items.push(Item {
            span: slots[6].span,
            kind: ItemKind::Any,
        });
    }
    Ok(Body::Fields {
        count: count as u8,
        slots,
        items,
        descriptor: None,
    })
}

fn count_all(bytes: &[u8], mut i: usize, end: usize) -> usize {
    let mut n = 0;
    while i < end {
        n += 1;
        i = skip_ws(bytes, next_ws(bytes, i, end), end);
    }
    n
}

fn parse_field(
    src: &str,
    kind: FieldKind,
    span: Span,
    seed: u64,
    out: &mut Vec<Item>,
) -> Result<(), ParseError> {
    let bytes = src.as_bytes();
    let first = out.len();
    let mut start = span.start;
    loop {
        let mut stop = start;
        while stop < span.end && bytes[stop] != b',' {
            stop += 1;
        }
        if stop == start {
            let at = Span::new(
                start.saturating_sub(usize::from(start > span.start)),
                (start + 1).min(span.end.max(start + 1)),
            );
            return Err(ParseError::new(
                ErrorKind::EmptyElement,
                at,
                format!("empty element in the {} field", kind.name()),
            )
            .help("remove the extra comma: list elements are separated by exactly one `,`"));
        }
        out.push(parse_item(src, kind, Span::new(start, stop), seed)?);
        if stop == span.end {
            break;
        }
        start = stop + 1;
        if start == span.end {
            return Err(ParseError::new(
                ErrorKind::EmptyElement,
                Span::new(stop, start),
                format!("the {} field ends with a comma", kind.name()),
            )
            .help("remove the trailing comma"));
        }
    }
    let items = &out[first..];
    if items.len() > 1 {
        if let Some(q) = items.iter().find(|i| i.kind == ItemKind::NoSpecific) {
            return Err(ParseError::new(
                ErrorKind::Misplaced,
                q.span,
                "`?` must stand alone in its field",
            )
            .help("write `?` by itself, or list the values you want"));
        }
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok {
    Num(u32),
    Word,
    Star,
    Question,
    Dash,
    Slash,
    Hash,
    LParen,
    RParen,
}

fn tokenize(src: &str, span: Span) -> Result<([(Tok, Span); 8], usize), ParseError> {
    let bytes = src.as_bytes();
    let mut toks = [(Tok::Star, Span::new(0, 0)); 8];
    let mut n = 0;
    let mut i = span.start;
    while i < span.end {
        let start = i;
        let b = bytes[i];
        let tok = if b.is_ascii_digit() {
            let mut v: u32 = 0;
            while i < span.end && bytes[i].is_ascii_digit() {
                v = v
                    .saturating_mul(10)
                    .saturating_add(u32::from(bytes[i] - b'0'));
                i += 1;
            }
            Tok::Num(v)
        } else if b.is_ascii_alphabetic() {
            while i < span.end && bytes[i].is_ascii_alphabetic() {
                i += 1;
            }
            Tok::Word
        } else {
            i += 1;
            match b {
                b'*' => Tok::Star,
                b'?' => Tok::Question,
                b'-' => Tok::Dash,
                b'/' => Tok::Slash,
                b'#' => Tok::Hash,
                b'(' => Tok::LParen,
                b')' => Tok::RParen,
                _ => {
                    return Err(ParseError::new(
                        ErrorKind::UnexpectedChar,
                        Span::new(start, i),
                        format!("unexpected character `{}`", b as char),
                    )
                    .help("fields use digits, names and `* , - / ? # L W H`"));
                }
            }
        };
        if n == toks.len() {
            return Err(ParseError::new(
                ErrorKind::UnexpectedChar,
                Span::new(start, span.end),
                "unexpected text at the end of the element",
            )
            .help("an element is a value, a range `a-b` or a step such as `a-b/n`"));
        }
        toks[n] = (tok, Span::new(start, i));
        n += 1;
    }
    Ok((toks, n))
}

fn expected(kind: FieldKind) -> String {
    let base = format!("a number {}-{}", kind.min(), kind.max());
    let names = match kind {
        FieldKind::Month => " or a name JAN-DEC",
        FieldKind::DayOfWeek => " (0 and 7 are Sunday) or a name SUN-SAT",
        _ => "",
    };
    let specials = match kind {
        FieldKind::DayOfMonth => ", `?`, `L`, `L-n`, `LW`, `nW`",
        FieldKind::DayOfWeek => ", `?`, `nL`, `n#k`",
        _ => "",
    };
    format!(
        "accepted: {base}{names}, `*`, a range `a-b`, a step `*/n`, `a/n` or `a-b/n`, `H`{specials}, or a comma-separated list of these"
    )
}

fn parse_item(src: &str, kind: FieldKind, span: Span, seed: u64) -> Result<Item, ParseError> {
    // Fast paths for the most common elements: `*`, a number, `*/n`.
    let bytes = &src.as_bytes()[span.start..span.end];
    let number = |b: &[u8]| -> Option<u32> {
        (!b.is_empty() && b.len() <= 9 && b.iter().all(u8::is_ascii_digit))
            .then(|| b.iter().fold(0u32, |v, d| v * 10 + u32::from(d - b'0')))
    };
    match bytes {
        [b'*'] => {
            return Ok(Item {
                span,
                kind: ItemKind::Any,
            });
        }
        [b'*', b'/', rest @ ..] => {
            if let Some(s) = number(rest) {
                let s = step(s, Span::new(span.start + 2, span.end))?;
                return Ok(Item {
                    span,
                    kind: ItemKind::Step {
                        base: StepBase::Any,
                        step: s,
                    },
                });
            }
        }
        _ => {
            if let Some(v) = number(bytes) {
                return Ok(Item {
                    span,
                    kind: ItemKind::Value(value(src, kind, (Tok::Num(v), span))?),
                });
            }
        }
    }
    let (toks, n) = tokenize(src, span)?;
    let t = &toks[..n];
    let text = |s: Span| &src[s.start..s.end];
    let word_is = |s: Span, w: &str| text(s).eq_ignore_ascii_case(w);
    let item = |k| Ok(Item { span, kind: k });
    let is_dom = kind == FieldKind::DayOfMonth;
    let is_dow = kind == FieldKind::DayOfWeek;
    use Tok::*;
    match t {
        [(Star, _)] => item(ItemKind::Any),
        [(Star, _), (Slash, _), (Num(s), ss)] => item(ItemKind::Step {
            base: StepBase::Any,
            step: step(*s, *ss)?,
        }),
        [(Question, s)] => {
            if is_dom || is_dow {
                item(ItemKind::NoSpecific)
            } else {
                Err(misplaced(
                    *s,
                    "`?`",
                    kind,
                    "it means \"any\" in day-of-month or day-of-week only",
                )
                .help("use `*` here"))
            }
        }
        [(Word, w), rest @ ..] if word_is(*w, "H") => parse_hash(kind, span, *w, rest, seed),
        [(Word, w)] if word_is(*w, "L") && is_dom => item(ItemKind::LastDay(0)),
        [(Word, w), (Dash, _), (Num(v), vs)] if word_is(*w, "L") && is_dom => {
            if *v > 30 {
                return Err(ParseError::new(
                    ErrorKind::OutOfRange,
                    *vs,
                    format!("`L-{v}` reaches before the first day of every month"),
                )
                .help("`L-n` takes n from 0 to 30"));
            }
            item(ItemKind::LastDay(*v as u16))
        }
        [(Word, w)] if word_is(*w, "LW") && is_dom => item(ItemKind::LastWeekday),
        [(Word, w)] if word_is(*w, "L") && is_dow => Err(misplaced(
            *w,
            "`L` alone",
            kind,
            "dialects disagree on what it means there",
        )
        .help(
            "write `5L` for the last Friday of the month, or `L` in day-of-month for the last day",
        )),
        [v @ (Num(_) | Word, _), (Word, w)] if word_is(*w, "W") => {
            if !is_dom {
                return Err(misplaced(
                    *w,
                    "`W`",
                    kind,
                    "it means \"nearest weekday\" in day-of-month only",
                ));
            }
            let day = value(src, kind, *v)?;
            item(ItemKind::NearestWeekday(day))
        }
        [v @ (Num(_) | Word, _), (Word, w)] if word_is(*w, "L") => {
            if !is_dow {
                return Err(misplaced(
                    *w,
                    "`nL`",
                    kind,
                    "it means \"last n-day of the month\" in day-of-week only",
                )
                .help("in day-of-month, `L` alone is the last day and `L-n` counts back from it"));
            }
            item(ItemKind::LastOfMonth(weekday(value(src, kind, *v)?)))
        }
        [v @ (Num(_) | Word, _), (Hash, hs), rest @ ..] => {
            if !is_dow {
                return Err(misplaced(
                    *hs,
                    "`#`",
                    kind,
                    "`n#k` means \"k-th n-day of the month\" in day-of-week only",
                ));
            }
            let wd = weekday(value(src, kind, *v)?);
            match rest {
                [(Num(k), ks)] if (1..=5).contains(k) => item(ItemKind::Nth {
                    weekday: wd,
                    nth: *k as u8,
                }),
                [(Num(k), ks)] => Err(ParseError::new(
                    ErrorKind::OutOfRange,
                    *ks,
                    format!("there is no {k}th weekday of the same kind in a month"),
                )
                .help("`n#k` takes k from 1 to 5")),
                _ => Err(ParseError::new(
                    ErrorKind::UnexpectedChar,
                    Span::new(hs.end, span.end),
                    "expected a number 1-5 after `#`",
                )
                .help("for example `1#2`, the second Monday of the month")),
            }
        }
        [v @ (Num(_) | Word, _)] => item(ItemKind::Value(value(src, kind, *v)?)),
        [a @ (Num(_) | Word, _), (Dash, _), b @ (Num(_) | Word, _)] => {
            let (lo, hi) = range(src, kind, *a, *b)?;
            item(ItemKind::Range(lo, hi))
        }
        [a @ (Num(_) | Word, _), (Slash, _), (Num(s), ss)] => {
            let lo = value(src, kind, *a)?;
            item(ItemKind::Step {
                base: StepBase::From(lo),
                step: step(*s, *ss)?,
            })
        }
        [
            a @ (Num(_) | Word, _),
            (Dash, _),
            b @ (Num(_) | Word, _),
            (Slash, _),
            (Num(s), ss),
        ] => {
            let (lo, hi) = range(src, kind, *a, *b)?;
            item(ItemKind::Step {
                base: StepBase::Range(lo, hi),
                step: step(*s, *ss)?,
            })
        }
        _ => Err(syntax_error(src, kind, span, t)),
    }
}

fn misplaced(span: Span, what: &str, kind: FieldKind, why: &str) -> ParseError {
    ParseError::new(
        ErrorKind::Misplaced,
        span,
        format!("{what} is not allowed in the {} field: {why}", kind.name()),
    )
}

/// Finds the first token that breaks the grammar and explains it.
fn syntax_error(src: &str, kind: FieldKind, span: Span, t: &[(Tok, Span)]) -> ParseError {
    // A lone word: an unknown name, or a value word in a field without names.
    if let Some((_, w)) = t.iter().find(|(tok, _)| *tok == Tok::Word) {
        if let Err(e) = value(src, kind, (Tok::Word, *w)) {
            return e;
        }
    }
    let valid_prefix = match t {
        [(Tok::Star, _), (Tok::Slash, _), ..] => 3,
        [(Tok::Star, _), ..] | [(Tok::Question, _), ..] => 1,
        [_, (Tok::Dash, _), _, (Tok::Slash, _), ..] => 5,
        [_, (Tok::Dash, _), _, ..] | [_, (Tok::Slash, _), _, ..] => 3,
        [_, (Tok::Dash | Tok::Slash, _)] => 2,
        _ => 1,
    };
    let at = valid_prefix.min(t.len().saturating_sub(1));
    let bad = t[at].1;
    let err = if at + 1 == t.len() && matches!(t[at].0, Tok::Dash | Tok::Slash) {
        ParseError::new(
            ErrorKind::UnexpectedChar,
            bad,
            format!(
                "`{}` must be followed by a number",
                &src[bad.start..bad.end]
            ),
        )
    } else {
        ParseError::new(
            ErrorKind::UnexpectedChar,
            Span::new(bad.start, span.end),
            format!(
                "unexpected `{}` in the {} field",
                &src[bad.start..span.end],
                kind.name()
            ),
        )
    };
    err.help(expected(kind))
}

fn step(s: u32, span: Span) -> Result<u32, ParseError> {
    if s == 0 {
        return Err(
            ParseError::new(ErrorKind::ZeroStep, span, "a step of 0 never advances")
                .help("use a step of 1 or more, such as `*/5`"),
        );
    }
    Ok(s)
}

fn weekday(v: u16) -> u8 {
    (v % 7) as u8
}

/// Resolves a number or a name and checks it against the field's range.
fn value(src: &str, kind: FieldKind, (tok, span): (Tok, Span)) -> Result<u16, ParseError> {
    let (min, max) = (kind.min(), kind.max());
    match tok {
        Tok::Num(v) => {
            if v < u32::from(min) || v > u32::from(max) {
                let mut err = ParseError::new(
                    ErrorKind::OutOfRange,
                    span,
                    format!("{v} is out of range for the {} field", kind.name()),
                );
                err.suggestion = Some(match (kind, v) {
                    (FieldKind::Hour, 24) => "hours are 0-23; midnight is 0".into(),
                    (FieldKind::Minute | FieldKind::Second, 60) => {
                        format!("{}s are 0-59", kind.name())
                    }
                    (FieldKind::DayOfMonth, 0) => {
                        "days of the month start at 1; `L` is the last day".into()
                    }
                    (FieldKind::Month, 0) => "months are 1-12 (JAN-DEC)".into(),
                    (FieldKind::DayOfWeek, _) => {
                        "weekdays are 0-7, where 0 and 7 are Sunday (1 is Monday)".into()
                    }
                    _ => format!("accepted: {min}-{max}"),
                });
                return Err(err);
            }
            Ok(v as u16)
        }
        _ => {
            let word = &src[span.start..span.end];
            let upper = word.to_ascii_uppercase();
            let table: &[&str] = match kind {
                FieldKind::Month => &MONTHS,
                FieldKind::DayOfWeek => &WEEKDAYS,
                _ => &[],
            };
            if let Some(i) = table.iter().position(|n| *n == upper) {
                return Ok(i as u16 + kind.min());
            }
            let err = ParseError::new(
                ErrorKind::UnknownName,
                span,
                format!("unknown name `{word}` in the {} field", kind.name()),
            );
            let other = if kind == FieldKind::Month {
                &WEEKDAYS[..]
            } else {
                &MONTHS[..]
            };
            Err(if table.is_empty() {
                err.help(format!(
                    "the {} field takes numbers {min}-{max}, not names",
                    kind.name()
                ))
            } else if other.contains(&upper.as_str()) {
                err.help(format!(
                    "`{word}` is a {} name; this field takes {}",
                    if kind == FieldKind::Month {
                        "weekday"
                    } else {
                        "month"
                    },
                    table.join(", ")
                ))
            } else if let Some(best) = closest(&upper, table.iter().copied()) {
                err.help(format!("did you mean `{best}`?"))
            } else {
                err.help(format!("accepted names: {}", table.join(", ")))
            })
        }
    }
}

fn range(
    src: &str,
    kind: FieldKind,
    a: (Tok, Span),
    b: (Tok, Span),
) -> Result<(u16, u16), ParseError> {
    let lo = value(src, kind, a)?;
    let mut hi = value(src, kind, b)?;
    // `FRI-SUN`: a weekday name ending a range means the Sunday that ends the week.
    if kind == FieldKind::DayOfWeek && hi == 0 && b.0 == Tok::Word {
        hi = 7;
    }
    if lo > hi {
        let span = a.1.to(b.1);
        let err = ParseError::new(
            ErrorKind::ReversedRange,
            span,
            format!("the range `{}` runs backwards", &src[span.start..span.end]),
        );
        let (ta, tb) = (&src[a.1.start..a.1.end], &src[b.1.start..b.1.end]);
        return Err(match kind {
            FieldKind::Year => err.help(format!("write `{tb}-{ta}`")),
            FieldKind::DayOfWeek if hi == 0 => err.help(format!("write `{ta}-7`: 7 is Sunday too")),
            _ => {
                let (max, min) = if a.0 == Tok::Word {
                    let table: &[&str] = if kind == FieldKind::Month {
                        &MONTHS
                    } else {
                        &WEEKDAYS
                    };
                    (table[table.len() - 1].to_string(), table[0].to_string())
                } else {
                    (kind.open_max().to_string(), kind.min().to_string())
                };
                err.help(format!("to wrap around, write `{ta}-{max},{min}-{tb}`"))
            }
        });
    }
    Ok((lo, hi))
}

fn parse_hash(
    kind: FieldKind,
    span: Span,
    h: Span,
    rest: &[(Tok, Span)],
    seed: u64,
) -> Result<Item, ParseError> {
    if kind == FieldKind::Year {
        return Err(misplaced(h, "`H`", kind, "a hashed year would rarely fire")
            .help("write the years explicitly"));
    }
    // Days of the month default to 1-28 so that a hashed day exists in every month.
    let default_hi = if kind == FieldKind::DayOfMonth {
        28
    } else {
        kind.open_max()
    };
    let (lo, hi, rest) = match rest {
        [
            (Tok::LParen, _),
            (Tok::Num(a), sa),
            (Tok::Dash, _),
            (Tok::Num(b), sb),
            (Tok::RParen, _),
            rest @ ..,
        ] => {
            for (v, s) in [(*a, *sa), (*b, *sb)] {
                if v < u32::from(kind.min()) || v > u32::from(kind.open_max()) {
                    return Err(ParseError::new(
                        ErrorKind::OutOfRange,
                        s,
                        format!("{v} is out of range for the {} field", kind.name()),
                    )
                    .help(format!(
                        "accepted: {}-{}",
                        kind.min(),
                        kind.open_max()
                    )));
                }
            }
            if a > b {
                return Err(ParseError::new(
                    ErrorKind::ReversedRange,
                    sa.to(*sb),
                    "the range of `H(a-b)` runs backwards",
                )
                .help(format!("write `H({b}-{a})`")));
            }
            (*a as u16, *b as u16, rest)
        }
        [(Tok::LParen, s), ..] => {
            return Err(ParseError::new(
                ErrorKind::UnexpectedChar,
                Span::new(s.start, span.end),
                "malformed `H(a-b)`",
            )
            .help("write a range in parentheses, such as `H(0-29)`"));
        }
        rest => (kind.min(), default_hi, rest),
    };
    let step = match rest {
        [] => None,
        [(Tok::Slash, _), (Tok::Num(s), ss)] => Some(step(*s, *ss)?),
        [(_, s), ..] => {
            return Err(ParseError::new(
                ErrorKind::UnexpectedChar,
                Span::new(s.start, span.end),
                "unexpected text after `H`",
            )
            .help("write `H`, `H/n`, `H(a-b)` or `H(a-b)/n`"));
        }
    };
    let h = crate::hash::field_hash(seed, kind);
    let size = u64::from(hi - lo) + 1;
    let modulus = step.map_or(size, |s| u64::from(s).min(size));
    let start = lo + (h % modulus) as u16;
    Ok(Item {
        span,
        kind: ItemKind::Hash {
            lo,
            hi,
            step,
            start,
        },
    })
}

/// The candidate closest to `word` by edit distance, if it is close enough to
/// be a plausible typo.
fn closest<'a>(word: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .map(|c| {
            (
                edit_distance(&word.to_ascii_uppercase(), &c.to_ascii_uppercase()),
                c,
            )
        })
        .filter(|(d, c)| *d <= 2.min(c.len() / 2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}
