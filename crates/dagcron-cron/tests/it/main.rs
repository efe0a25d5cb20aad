//! Integration tests of the cron engine: one binary, one module per concern.

mod differential;
mod dst;
mod errors;
mod explain;
mod fuzz_corpus;
mod oracle;
mod props;
mod rrule;
mod syntax;

use dagcron_cron::{Options, Schedule};
use jiff::Timestamp;
use jiff::tz::TimeZone;

/// Parses `expr` in zone `tz` with seed 42 for `H`.
pub(crate) fn schedule(expr: &str, tz: &str) -> Schedule {
    let options = Options {
        time_zone: TimeZone::get(tz).unwrap(),
        hash_seed: 42,
        ..Options::default()
    };
    Schedule::parse_with(expr, &options).unwrap_or_else(|e| panic!("{expr:?}: {e}"))
}

pub(crate) fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// The next `n` fires after `from`, one per line, in local time with the DST note.
pub(crate) fn preview(s: &Schedule, from: &str, n: usize) -> String {
    let mut out = String::new();
    for f in s.fires_after(ts(from)).take(n) {
        let local =
            f.at.to_zoned_datetime(s.time_zone().clone())
                .strftime("%Y-%m-%d %a %H:%M:%S %:z")
                .to_string();
        out.push_str(&local);
        if let Some(note) = f.dst {
            out.push_str(&format!("  [{}]", note.describe()));
        }
        out.push('\n');
    }
    out
}
