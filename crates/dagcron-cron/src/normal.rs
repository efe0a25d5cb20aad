//! The normal form: one spelling per schedule, computed from the compiled
//! sets rather than from the text, so `@daily`, `0 0 * * *` and
//! `0 0 0 ? * * *` all print `0 0 0 * * * *`.
//!
//! It round-trips: parsing the normal form gives the same schedule, including
//! the wall-clock/rhythm distinction that decides daylight-saving behaviour.

use crate::ast::Body;
use crate::civil::Compiled;
use crate::schedule::Schedule;

/// How a field may be printed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    /// Plain comma-separated numbers only (wall-clock fields).
    Plain,
    /// Ranges and steps, `*` allowed.
    Compact,
    /// Ranges and steps, but never starting with `*` (day fields in "either" mode).
    NoStar,
}

fn values(bits: u64, lo: u16, hi: u16) -> Vec<u16> {
    (lo..=hi).filter(|v| bits & (1 << v) != 0).collect()
}

fn fmt_values(vals: &[u16], lo: u16, hi: u16, style: Style) -> String {
    if style == Style::Plain {
        return vals
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",");
    }
    if vals.len() == usize::from(hi - lo) + 1 && style == Style::Compact {
        return "*".into();
    }
    // An arithmetic progression of three or more values.
    if vals.len() >= 3 {
        let step = vals[1] - vals[0];
        if step > 1 && vals.windows(2).all(|w| w[1] - w[0] == step) {
            let (first, last) = (vals[0], vals[vals.len() - 1]);
            let to_end = u32::from(last) + u32::from(step) > u32::from(hi);
            return match (first == lo && style == Style::Compact, to_end) {
                (true, true) => format!("*/{step}"),
                (_, true) => format!("{first}/{step}"),
                _ => format!("{first}-{last}/{step}"),
            };
        }
    }
    let mut parts = Vec::new();
    let mut i = 0;
    while i < vals.len() {
        let mut j = i;
        while j + 1 < vals.len() && vals[j + 1] == vals[j] + 1 {
            j += 1;
        }
        if j > i {
            parts.push(format!("{}-{}", vals[i], vals[j]));
        } else {
            parts.push(vals[i].to_string());
        }
        i = j + 1;
    }
    parts.join(",")
}

/// A day field in "both must match" mode whose source started with `*`:
/// print the sparsest `*/n` progression it contains, then the rest.
fn fmt_star_prefixed(vals: &[u16], lo: u16, hi: u16, extra: &[String]) -> String {
    let step = (1..=hi - lo + 1)
        .find(|n| {
            (lo..=hi)
                .step_by(usize::from(*n))
                .all(|v| vals.contains(&v))
        })
        .unwrap_or(hi - lo + 1);
    let prog: Vec<u16> = (lo..=hi).step_by(usize::from(step)).collect();
    let rest: Vec<u16> = vals.iter().copied().filter(|v| !prog.contains(v)).collect();
    let mut parts = vec![if step == 1 {
        "*".to_string()
    } else {
        format!("*/{step}")
    }];
    if !rest.is_empty() {
        parts.push(fmt_values(&rest, lo, hi, Style::NoStar));
    }
    parts.extend(extra.iter().cloned());
    parts.join(",")
}

fn dom_specials(c: &Compiled) -> Vec<String> {
    let mut out = Vec::new();
    for n in 0..31 {
        if c.dom_last & (1 << n) != 0 {
            out.push(if n == 0 {
                "L".to_string()
            } else {
                format!("L-{n}")
            });
        }
    }
    if c.dom_last_weekday {
        out.push("LW".into());
    }
    out.extend(
        (1..=31)
            .filter(|n| c.dom_nearest & (1 << n) != 0)
            .map(|n| format!("{n}W")),
    );
    out
}

fn dow_specials(c: &Compiled) -> Vec<String> {
    let mut out = Vec::new();
    for w in 0..7 {
        if c.dow_last & (1 << w) != 0 {
            out.push(format!("{w}L"));
        }
        out.extend(
            (1..=5)
                .filter(|k| c.dow_nth[w] & (1 << k) != 0)
                .map(|k| format!("{w}#{k}")),
        );
    }
    out
}

fn join_field(plain: String, specials: Vec<String>) -> String {
    let mut parts: Vec<String> = Vec::new();
    if !plain.is_empty() {
        parts.push(plain);
    }
    parts.extend(specials);
    parts.join(",")
}

pub(crate) fn normalized(schedule: &Schedule) -> String {
    let mut out = String::new();
    let tz = schedule.time_zone();
    if let Body::Rule(rule) = &schedule.ast().body {
        // A zone the rule named stays (TZID=UTC included); the job's, when
        // it is not UTC, is written in.
        let named = schedule.ast().time_zone.is_some();
        return rule.normalized(tz.iana_name().filter(|n| named || *n != "UTC"));
    }
    if let Some(name) = tz.iana_name().filter(|n| *n != "UTC") {
        out.push_str(&format!("CRON_TZ={name} "));
    }
    if let Some(at) = schedule.once() {
        let at = jiff::Timestamp::from_second(at).expect("a parsed instant");
        // The instant is absolute: no zone prefix.
        return format!("@at {at}");
    }
    let Some(c) = schedule.compiled() else {
        let (period, _) = schedule.every().expect("every");
        out.push_str(&format!("@every {period}s"));
        return out;
    };
    let time_style = if schedule.is_wall_clock() {
        Style::Plain
    } else {
        Style::Compact
    };
    let sec = values(c.seconds, 0, 59);
    let min = values(c.minutes, 0, 59);
    let hour = values(c.hours, 0, 23);
    let mut fields = vec![
        fmt_values(&sec, 0, 59, time_style),
        fmt_values(&min, 0, 59, time_style),
        fmt_values(&hour, 0, 23, time_style),
    ];
    let is_plain = |s: &str| s.bytes().all(|b| b.is_ascii_digit() || b == b',');
    if time_style == Style::Compact && fields.iter().all(|f| is_plain(f)) {
        // A rhythm whose fields all print as plain numbers would read back
        // as wall-clock times: keep one range to preserve its DST behaviour.
        fields[2] = format!(
            "{h}-{h}{}",
            fields[2].strip_prefix(&hour[0].to_string()).unwrap_or(""),
            h = hour[0]
        );
    }

    let dom_vals = values(u64::from(c.dom), 1, 31);
    let dow_vals = values(u64::from(c.dow), 0, 6);
    let (dspec, wspec) = (dom_specials(c), dow_specials(c));
    let dom_full = dom_vals.len() == 31;
    let dow_full = dow_vals.len() == 7;
    let (dom, dow) = if !c.and_days && (dom_full || dow_full) || c.and_days && dom_full && dow_full
    {
        ("*".to_string(), "*".to_string())
    } else if c.and_days && dom_full {
        (
            "*".to_string(),
            join_field(fmt_values(&dow_vals, 0, 6, Style::NoStar), wspec),
        )
    } else if c.and_days && dow_full {
        (
            join_field(fmt_values(&dom_vals, 1, 31, Style::NoStar), dspec),
            "*".to_string(),
        )
    } else if c.and_days {
        // Both restricted, and both must match: the source had `*/n` in one
        // of them, so that field holds its first value. Print it that way.
        if dom_vals.first() == Some(&1) {
            (
                fmt_star_prefixed(&dom_vals, 1, 31, &dspec),
                join_field(fmt_values(&dow_vals, 0, 6, Style::NoStar), wspec),
            )
        } else {
            (
                join_field(fmt_values(&dom_vals, 1, 31, Style::NoStar), dspec),
                fmt_star_prefixed(&dow_vals, 0, 6, &wspec),
            )
        }
    } else {
        (
            join_field(fmt_values(&dom_vals, 1, 31, Style::NoStar), dspec),
            join_field(fmt_values(&dow_vals, 0, 6, Style::NoStar), wspec),
        )
    };
    fields.push(dom);
    fields.push(fmt_values(&values(c.months, 1, 12), 1, 12, Style::Compact));
    fields.push(dow);
    fields.push(match &c.years {
        None => "*".into(),
        Some(y) => {
            let ys: Vec<u16> = y.iter().map(|y| y as u16).collect();
            // Never `*`: a year field restricts fires to 1970-2099, and `*` would not.
            fmt_values(&ys, 1970, 2099, Style::NoStar)
        }
    });
    out.push_str(&fields.join(" "));
    out
}
