//! Time zones: from civil matches to instants, with the daylight-saving rules.
//!
//! A zone's timeline is cut into *segments* at its transitions; inside a
//! segment the UTC offset is constant, so civil time is the instant plus a
//! constant and the civil search of [`crate::civil`] applies directly. The
//! edges of a segment are where DST policy decides:
//!
//! - a *gap* (the offset grows, so local times are skipped): under
//!   [`DstGap::Shift`] the skipped times that match fire once, at the first
//!   instant after the gap; under [`DstGap::Skip`] they do not fire;
//! - a *fold* (the offset shrinks, so local times repeat): the policy
//!   [`DstOverlap`] keeps the first occurrence, the last, or both.

use jiff::Timestamp;
use jiff::tz::TimeZone;

use crate::civil::{CivilSet, Search};
use crate::error::{ErrorKind, ParseError, Span};

/// What a fire does with wall-clock times that a spring-forward gap skips.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DstGap {
    /// Fire once at the first instant after the gap.
    Shift,
    /// Do not fire for times that do not exist.
    Skip,
}

/// What a fire does with wall-clock times that a fall-back overlap repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DstOverlap {
    /// Fire at the first occurrence only.
    First,
    /// Fire at the second occurrence only.
    Last,
    /// Fire at both occurrences.
    Both,
}

/// How a daylight-saving rule shaped a fire, for previews and the fire ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DstNote {
    /// A local time that did not exist (spring-forward gap) moved to the first
    /// instant after the gap.
    Shifted,
    /// Several local times (skipped ones, or skipped ones and the first time
    /// after the gap) collapsed into this one fire.
    Collapsed,
    /// The first occurrence of a repeated local time; the second does not fire.
    FirstOfRepeated,
    /// The second occurrence of a repeated local time; the first did not fire.
    LastOfRepeated,
    /// A repeated local time that fires twice: this is the first occurrence.
    DoubledFirst,
    /// A repeated local time that fires twice: this is the second occurrence.
    DoubledSecond,
}

impl DstNote {
    /// A short phrase for tables.
    pub fn describe(self) -> &'static str {
        match self {
            DstNote::Shifted => "moved: local time skipped by DST",
            DstNote::Collapsed => "collapsed: several skipped local times",
            DstNote::FirstOfRepeated => "repeated hour: first occurrence only",
            DstNote::LastOfRepeated => "repeated hour: moved to second occurrence",
            DstNote::DoubledFirst => "repeated hour: fires twice (1st)",
            DstNote::DoubledSecond => "repeated hour: fires twice (2nd)",
        }
    }
}

/// Looks a zone up in the bundled IANA database.
pub(crate) fn lookup(name: &str, span: Span) -> Result<TimeZone, ParseError> {
    if name.eq_ignore_ascii_case("UTC") {
        return Ok(TimeZone::UTC);
    }
    TimeZone::get(name).map_err(|_| {
        let err = ParseError::new(
            ErrorKind::TimeZone,
            span,
            format!("unknown time zone `{name}`"),
        );
        let best = jiff::tz::db()
            .available()
            .map(|n| {
                (
                    crate::parse::edit_distance(
                        &name.to_ascii_lowercase(),
                        &n.as_str().to_ascii_lowercase(),
                    ),
                    n,
                )
            })
            .min_by_key(|(d, _)| *d)
            .filter(|(d, _)| *d <= 3);
        match best {
            Some((_, n)) => err.help(format!("did you mean `{}`?", n.as_str())),
            None => err
                .help("use an IANA zone name such as `Europe/Berlin`, `America/New_York` or `UTC`"),
        }
    })
}

/// A stretch of the timeline with a constant UTC offset, `[start, end)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Segment {
    pub(crate) start: i64,
    pub(crate) end: i64,
    pub(crate) offset: i64,
    pub(crate) prev_offset: i64,
    pub(crate) next_offset: i64,
}

impl Segment {
    pub(crate) fn fixed(offset: i64) -> Segment {
        Segment {
            start: i64::MIN,
            end: i64::MAX,
            offset,
            prev_offset: offset,
            next_offset: offset,
        }
    }

    pub(crate) fn contains(&self, i: i64) -> bool {
        self.start <= i && i < self.end
    }
}

fn ts(secs: i64) -> Timestamp {
    Timestamp::from_second(secs.clamp(Timestamp::MIN.as_second(), Timestamp::MAX.as_second()))
        .expect("clamped")
}

/// The segment of `tz` that contains the instant `i`.
pub(crate) fn segment_at(tz: &TimeZone, i: i64) -> Segment {
    let offset = i64::from(tz.to_offset(ts(i)).seconds());
    let (start, prev_offset) = match tz.preceding(ts(i.saturating_add(1))).next() {
        Some(t) => {
            let s = t.timestamp().as_second();
            (s, i64::from(tz.to_offset(ts(s - 1)).seconds()))
        }
        None => (i64::MIN, offset),
    };
    let (end, next_offset) = match tz.following(ts(i)).next() {
        Some(t) => (t.timestamp().as_second(), i64::from(t.offset().seconds())),
        None => (i64::MAX, offset),
    };
    Segment {
        start,
        end,
        offset,
        prev_offset,
        next_offset,
    }
}

/// The DST policy of a schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Policy {
    pub(crate) gap: DstGap,
    pub(crate) overlap: DstOverlap,
}

impl Policy {
    /// The options' overrides, else shift and first for wall-clock times,
    /// skip and both for rhythms.
    pub(crate) fn defaults(wall_clock: bool, options: &crate::Options) -> Policy {
        Policy {
            gap: options.dst_gap.unwrap_or(if wall_clock {
                DstGap::Shift
            } else {
                DstGap::Skip
            }),
            overlap: options.dst_overlap.unwrap_or(if wall_clock {
                DstOverlap::First
            } else {
                DstOverlap::Both
            }),
        }
    }
}

/// The civil range `[lo, hi)` that this segment is responsible for, after the
/// overlap policy removed the occurrences that belong to a neighbour.
fn civil_range(seg: &Segment, policy: Policy) -> (i64, i64) {
    let mut lo = seg.start.saturating_add(seg.offset);
    if seg.offset < seg.prev_offset && policy.overlap == DstOverlap::First {
        // The start of this segment repeats local times the previous one had.
        lo = seg.start.saturating_add(seg.prev_offset);
    }
    let mut hi = seg.end.saturating_add(seg.offset);
    if seg.next_offset < seg.offset && policy.overlap == DstOverlap::Last {
        // The end of this segment holds local times the next one repeats.
        hi = seg.end.saturating_add(seg.next_offset);
    }
    (lo, hi)
}

/// If the segment starts after a gap and the policy shifts, whether the gap
/// held a matching local time, and so whether `seg.start` fires.
fn gap_fire(c: &dyn CivilSet, seg: &Segment, policy: Policy) -> Option<DstNote> {
    if policy.gap != DstGap::Shift || seg.offset <= seg.prev_offset || seg.start == i64::MIN {
        return None;
    }
    let (lo, hi) = (seg.start + seg.prev_offset, seg.start + seg.offset);
    let Search::Found(first) = c.next(lo, hi) else {
        return None;
    };
    let collapsed = matches!(c.next(first + 1, hi), Search::Found(_)) || c.matches_civil(hi);
    Some(if collapsed {
        DstNote::Collapsed
    } else {
        DstNote::Shifted
    })
}

/// The note for a regular fire at civil time `civil` in `seg`.
fn fold_note(seg: &Segment, civil: i64, policy: Policy) -> Option<DstNote> {
    // Second occurrence: civil times at the start that the previous segment had too.
    if seg.offset < seg.prev_offset && civil < seg.start.saturating_add(seg.prev_offset) {
        return Some(match policy.overlap {
            DstOverlap::Both => DstNote::DoubledSecond,
            _ => DstNote::LastOfRepeated,
        });
    }
    // First occurrence: civil times at the end that the next segment repeats.
    if seg.next_offset < seg.offset && civil >= seg.end.saturating_add(seg.next_offset) {
        return Some(match policy.overlap {
            DstOverlap::Both => DstNote::DoubledFirst,
            _ => DstNote::FirstOfRepeated,
        });
    }
    None
}

/// The search state over one zone; it caches the current segment so that
/// iterating fires does not look transitions up again.
pub(crate) struct Walker<'a> {
    pub(crate) compiled: &'a dyn CivilSet,
    pub(crate) tz: &'a TimeZone,
    pub(crate) fixed: Option<i64>,
    pub(crate) policy: Policy,
    pub(crate) seg: Option<Segment>,
}

/// Bounds the number of segments one search may visit. A zone has at most a
/// few transitions a year and the civil search ends at year 9999, so this is
/// a safety net that real zones never reach.
const MAX_SEGMENTS: usize = 100_000;

impl Walker<'_> {
    fn segment(&mut self, i: i64) -> Segment {
        match (self.fixed, self.seg) {
            (Some(off), _) => Segment::fixed(off),
            (None, Some(seg)) if seg.contains(i) => seg,
            _ => {
                let seg = segment_at(self.tz, i);
                self.seg = Some(seg);
                seg
            }
        }
    }

    /// The first fire at or after the instant `from`.
    pub(crate) fn next_from(&mut self, from: i64) -> Option<(i64, Option<DstNote>)> {
        let mut seg = self.segment(from);
        // Civil times from here on match nothing; only a fold can bring the
        // search back below it.
        let mut exhausted_from = i64::MAX;
        for _ in 0..MAX_SEGMENTS {
            let (lo, hi) = civil_range(&seg, self.policy);
            let lo = lo.max(from.max(seg.start).saturating_add(seg.offset));
            if lo.min(seg.start.saturating_add(seg.prev_offset)) >= exhausted_from {
                return None;
            }
            if seg.start >= from {
                if let Some(note) = gap_fire(self.compiled, &seg, self.policy) {
                    return Some((seg.start, Some(note)));
                }
            }
            if lo < hi {
                match self.compiled.next(lo, hi) {
                    Search::Found(c) => {
                        return Some((c - seg.offset, fold_note(&seg, c, self.policy)));
                    }
                    Search::Exhausted => exhausted_from = exhausted_from.min(lo),
                    Search::Beyond => {}
                }
            }
            if seg.end == i64::MAX {
                return None;
            }
            seg = self.segment(seg.end);
        }
        None
    }

    /// The last fire at or before the instant `from`.
    pub(crate) fn prev_from(&mut self, from: i64) -> Option<(i64, Option<DstNote>)> {
        let mut seg = self.segment(from);
        let mut exhausted_to = i64::MIN;
        for _ in 0..MAX_SEGMENTS {
            let (lo, hi) = civil_range(&seg, self.policy);
            let hi = hi.min(
                from.min(seg.end.saturating_sub(1))
                    .saturating_add(seg.offset)
                    .saturating_add(1),
            );
            if hi.max(seg.start.saturating_add(seg.offset)) <= exhausted_to {
                return None;
            }
            let gap = if seg.start <= from {
                gap_fire(self.compiled, &seg, self.policy)
            } else {
                None
            };
            if lo < hi {
                match self.compiled.prev(hi - 1, lo) {
                    Search::Found(c) => {
                        let at = c - seg.offset;
                        let note = if at == seg.start && gap.is_some() {
                            gap
                        } else {
                            fold_note(&seg, c, self.policy)
                        };
                        return Some((at, note));
                    }
                    Search::Exhausted => exhausted_to = exhausted_to.max(hi),
                    Search::Beyond => {}
                }
            }
            if let Some(note) = gap {
                return Some((seg.start, Some(note)));
            }
            if seg.start == i64::MIN {
                return None;
            }
            seg = self.segment(seg.start - 1);
        }
        None
    }
}
