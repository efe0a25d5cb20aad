//! The dagcron cron language.
//!
//! One strict parser for 5-, 6- and 7-field expressions with Quartz
//! extensions (`L`, `W`, `#`), Jenkins-style `H`, `@` descriptors and
//! `CRON_TZ=` prefixes; a search that computes the next or previous fire by
//! field arithmetic on bit sets; daylight-saving rules that distinguish
//! wall-clock times from rhythms and can be overridden per schedule; an
//! English explanation and a normal form.
//!
//! ```
//! use dagcron_cron::Schedule;
//!
//! let s = Schedule::parse("*/15 9-17 * * MON-FRI").unwrap();
//! let t: jiff::Timestamp = "2026-11-27T17:50:00Z".parse().unwrap(); // a Friday
//! assert_eq!(s.next_after(t).unwrap().to_string(), "2026-11-30T09:00:00Z");
//! assert_eq!(s.normalized(), "0 */15 9-17 * * 1-5 *");
//! ```
//!
//! The crate does no I/O and never reads the clock: every query takes the
//! instant it is about. The semantic choices the language leaves open are
//! listed in `docs/cron.md`.
//!
//! # How it works
//!
//! The cron language. `parse.rs` turns text into the typed syntax tree of
//! `ast.rs` (every element keeps its byte span; errors in `error.rs` carry a
//! span, a message and a suggestion). `civil.rs` compiles the tree into bit sets
//! and searches *civil time* (local wall-clock seconds) by jumping from set bit
//! to set bit. `zone.rs` maps civil matches to instants: it cuts a zone's
//! timeline into segments of constant UTC offset and applies the daylight-saving
//! policy at segment edges (gaps and folds). `schedule.rs` is the public
//! `Schedule`; `explain.rs` writes English, `normal.rs` the normal form,
//! `hash.rs` the stable hashing behind `H`, `tzdb.rs` the version of the
//! bundled time zone database and a digest of each zone's rules (stored with
//! every version of a job beside `SEMANTICS_VERSION`).
//!
//! **Architecture Invariant:** every search is bounded (each step advances a
//! calendar field, years stop at 9999); no input can make it loop or panic.

mod ast;
mod calendar;
mod civil;
mod error;
mod explain;
#[doc(hidden)]
pub mod fuzzing;
mod hash;
mod normal;
mod parse;
mod rrule;
mod schedule;
mod tzdb;
mod zone;

pub use ast::{Ast, Descriptor, Field, FieldKind, Item, ItemKind, StepBase};
pub use error::{ErrorKind, ParseError, Span};
pub use hash::seed_from_key;
pub use parse::MAX_EXPRESSION_LEN;
pub use rrule::{Freq, MAX_COUNT, MAX_DATES, MAX_INTERVAL, MAX_RULE_LEN};
pub use schedule::{Fire, Fires, Options, Schedule, Timetable};
pub use tzdb::{tzdb_version, zone_digest};
pub use zone::{DstGap, DstNote, DstOverlap};

/// The version of the cron semantics. Stored with every schedule so that an
/// upgrade that changes a rule never silently moves a fire.
pub const SEMANTICS_VERSION: u32 = 1;

/// Whether `text` is written as an RFC 5545 recurrence rule (it starts
/// with `RRULE:`, `DTSTART`, `EXDATE` or `RDATE`) rather than a cron
/// expression.
pub fn is_recurrence_rule(text: &str) -> bool {
    rrule::looks_like_rule(text)
}

impl Schedule {
    /// A plain-English explanation.
    pub fn explain(&self) -> String {
        explain::explain(self)
    }

    /// The normal form: two spellings of the same schedule have the same
    /// normal form (7 fields, or `@every <seconds>s`, with a `CRON_TZ=`
    /// prefix when the zone is not UTC).
    pub fn normalized(&self) -> String {
        normal::normalized(self)
    }
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Schedule) -> bool {
        self.normalized() == other.normalized()
            && self.dst_gap() == other.dst_gap()
            && self.dst_overlap() == other.dst_overlap()
            && self.every().map(|e| e.1) == other.every().map(|e| e.1)
    }
}
