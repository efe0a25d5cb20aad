//! The hot-spot report: the seconds of a window at which the most jobs fire
//! together, and how to spread them. Many schedules written by hand share
//! the same instants (every `0 * * * *` job fires at the top of the hour,
//! every `*/5` one on the same five minutes); `H` gives each job its own
//! stable instant, derived from its name.
//!
//! Pure like the rest of the core: the window's start is an argument, and
//! the work is bounded by [`Limits`] (a report says when a limit stopped it).
//! [`Tally`] does the counting alone, for a gauge of the peak of fires per
//! second ([`peak_fires_per_second`]); [`Hotspots`] adds which jobs fire at
//! the hot seconds and what to write instead.

use std::collections::HashMap;
use std::fmt;

use dagcron_cron::{Descriptor, Field, FieldKind, ItemKind, Schedule, StepBase};
use jiff::{SignedDuration, Timestamp};

use crate::duration::Dur;
use crate::model::{Job, Timing};

/// The window when none is asked for: the next hour.
pub const DEFAULT_WINDOW: Dur = Dur::from_secs(3600);

/// The longest window: a day, at most 86 400 counters.
pub const MAX_WINDOW: Dur = Dur::from_secs(86_400);

/// Hot seconds reported when the caller does not say.
pub const DEFAULT_TOP: usize = 10;

/// The most hot seconds one report lists.
pub const MAX_TOP: usize = 100;

/// The most jobs listed under one hot second (its count is the total).
pub const JOBS_LISTED: usize = 20;

/// How much one count may do. Every job costs one search for its first fire
/// after the window, plus one per fire in the window; a job fires at most
/// once a second, so it has at most as many fires as the window has seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The most jobs counted.
    pub jobs: usize,
    /// The most searches for a next fire, over all jobs.
    pub work: usize,
}

impl Default for Limits {
    /// 100 000 jobs and a million searches: about a second of work, and a
    /// few tens of MiB held while the report is made.
    fn default() -> Limits {
        Limits {
            jobs: 100_000,
            work: 1_000_000,
        }
    }
}

/// A limit of [`Limits`] that stopped a count: the jobs added after it was
/// reached are not counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    /// [`Limits::jobs`] jobs were counted.
    Jobs(usize),
    /// The next job would have taken the searches past [`Limits::work`].
    Work(usize),
}

impl fmt::Display for Cap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cap::Jobs(n) => write!(f, "at most {n} jobs are counted"),
            Cap::Work(n) => write!(f, "at most {n} fires are counted"),
        }
    }
}

/// A query that cannot be answered: the window or the number of hot
/// seconds is out of bounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HotspotError {
    /// A window of zero length.
    EmptyWindow,
    /// A window longer than [`MAX_WINDOW`].
    WindowTooLong(Dur),
    /// A window that is not a whole number of seconds.
    FractionalWindow(Dur),
    /// A window that ends after the last representable instant.
    WindowOutOfRange,
    /// `top` of zero.
    NoTop,
    /// `top` larger than [`MAX_TOP`].
    TopTooLarge(usize),
}

impl fmt::Display for HotspotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HotspotError::EmptyWindow => write!(
                f,
                "the window is empty: give a duration of at least 1s, such as 30m or 1h"
            ),
            HotspotError::WindowTooLong(d) => write!(
                f,
                "a window of {d} is too long: at most {MAX_WINDOW}, such as 1h or 12h"
            ),
            HotspotError::FractionalWindow(d) => write!(
                f,
                "a window of {d} is not a whole number of seconds (fires fall on whole seconds)"
            ),
            HotspotError::WindowOutOfRange => {
                write!(
                    f,
                    "the window ends after the last instant that can be written"
                )
            }
            HotspotError::NoTop => write!(f, "top must be at least 1"),
            HotspotError::TopTooLarge(n) => {
                write!(f, "top {n} is too large: at most {MAX_TOP}")
            }
        }
    }
}

impl std::error::Error for HotspotError {}

/// The seconds `[from, from + length)` a count covers. Fires fall on whole
/// seconds, so a start within a second is moved to the next whole one (the
/// fires covered are the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The first second, whole.
    from: i64,
    /// How many seconds, 1 to [`MAX_WINDOW`].
    seconds: u32,
}

impl Window {
    /// The window of `length` from `from`.
    pub fn new(from: Timestamp, length: Dur) -> Result<Window, HotspotError> {
        if length.0.is_zero() {
            return Err(HotspotError::EmptyWindow);
        }
        if length > MAX_WINDOW {
            return Err(HotspotError::WindowTooLong(length));
        }
        if length.0.subsec_nanos() != 0 {
            return Err(HotspotError::FractionalWindow(length));
        }
        let from = from.as_second() + i64::from(from.subsec_nanosecond() > 0);
        let seconds = u32::try_from(length.0.as_secs()).expect("at most a day");
        Timestamp::from_second(from + i64::from(seconds))
            .map_err(|_| HotspotError::WindowOutOfRange)?;
        Ok(Window { from, seconds })
    }

    /// The next hour from `from`: the window of the peak gauge.
    pub fn next_hour(from: Timestamp) -> Result<Window, HotspotError> {
        Window::new(from, DEFAULT_WINDOW)
    }

    /// The first instant covered.
    pub fn from(&self) -> Timestamp {
        self.at(0)
    }

    /// The first instant after the window.
    pub fn to(&self) -> Timestamp {
        self.at(self.seconds)
    }

    /// Its length in seconds.
    pub fn seconds(&self) -> u32 {
        self.seconds
    }

    fn at(&self, offset: u32) -> Timestamp {
        Timestamp::from_second(self.from + i64::from(offset)).expect("checked by Window::new")
    }
}

/// What a report is asked for: a window and how many hot seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query {
    /// The seconds counted.
    pub window: Window,
    /// At most this many hot seconds, 1 to [`MAX_TOP`].
    pub top: usize,
}

impl Query {
    /// A query from `from`, with the defaults ([`DEFAULT_WINDOW`],
    /// [`DEFAULT_TOP`]) for what is not given; out-of-bounds values are errors.
    pub fn new(
        from: Timestamp,
        window: Option<Dur>,
        top: Option<usize>,
    ) -> Result<Query, HotspotError> {
        let window = Window::new(from, window.unwrap_or(DEFAULT_WINDOW))?;
        let top = match top.unwrap_or(DEFAULT_TOP) {
            0 => return Err(HotspotError::NoTop),
            n if n > MAX_TOP => return Err(HotspotError::TopTooLarge(n)),
            n => n,
        };
        Ok(Query { window, top })
    }
}

/// The largest number of fires due in one second of a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peak {
    /// Fires in the busiest second (0: none in the window).
    pub per_second: u32,
    /// The first second with that many (none: no fire in the window).
    pub at: Option<Timestamp>,
    /// Jobs counted.
    pub jobs: usize,
    /// Set when a limit stopped the count: the peak of the jobs counted,
    /// which the others can only raise.
    pub capped: Option<Cap>,
}

/// Fires per second over a window, counted one job at a time within
/// [`Limits`].
#[derive(Clone, Debug)]
pub struct Tally {
    window: Window,
    limits: Limits,
    /// Fires per second of the window.
    counts: Vec<u32>,
    jobs: usize,
    fires: u64,
    /// Searches done.
    work: usize,
    capped: Option<Cap>,
    /// The fires of the job added last, as offsets in the window.
    scratch: Vec<u32>,
}

impl Tally {
    /// An empty count over `window`.
    pub fn new(window: Window, limits: Limits) -> Tally {
        Tally {
            window,
            limits,
            counts: vec![0; window.seconds as usize],
            jobs: 0,
            fires: 0,
            work: 0,
            capped: None,
            scratch: Vec::new(),
        }
    }

    /// Counts one more job's fires (by the scheduler's rule, start and end
    /// dates included). Returns their offsets in the window, in seconds, or
    /// `None` once a limit is reached: then neither this job nor any added
    /// after it is counted, and the tally says so.
    pub fn add(&mut self, timing: &Timing) -> Option<&[u32]> {
        if self.capped.is_some() {
            return None;
        }
        if self.jobs >= self.limits.jobs {
            self.capped = Some(Cap::Jobs(self.limits.jobs));
            return None;
        }
        let budget = self.limits.work.saturating_sub(self.work);
        let to = self.window.to();
        self.scratch.clear();
        let mut searches = 0;
        let mut t = self
            .window
            .from()
            .checked_sub(SignedDuration::from_secs(1))
            .unwrap_or(Timestamp::MIN);
        loop {
            if searches == budget {
                self.capped = Some(Cap::Work(self.limits.work));
                return None;
            }
            searches += 1;
            match timing.next_fire_after(t) {
                Some(next) if next < to => {
                    let offset = next.as_second() - self.window.from;
                    self.scratch
                        .push(u32::try_from(offset).expect("a fire within the window"));
                    t = next;
                }
                _ => break,
            }
        }
        self.work += searches;
        self.jobs += 1;
        self.fires += self.scratch.len() as u64;
        for &offset in &self.scratch {
            self.counts[offset as usize] += 1;
        }
        Some(&self.scratch)
    }

    /// Whether a limit stopped the count.
    pub fn capped(&self) -> Option<Cap> {
        self.capped
    }

    /// The busiest second so far.
    pub fn peak(&self) -> Peak {
        let mut best: Option<(u32, u32)> = None;
        for (offset, &count) in self.counts.iter().enumerate() {
            if count > best.map_or(0, |b| b.0) {
                best = Some((count, offset as u32));
            }
        }
        Peak {
            per_second: best.map_or(0, |b| b.0),
            at: best.map(|b| self.window.at(b.1)),
            jobs: self.jobs,
            capped: self.capped,
        }
    }
}

/// The largest number of fires due in one second of `window` among jobs of
/// these timings (a paused job does not fire: leave it out). For the gauge
/// `dagcron_schedule_peak_fires_per_second`, over [`Window::next_hour`].
pub fn peak_fires_per_second<'a>(
    timings: impl IntoIterator<Item = &'a Timing>,
    window: Window,
    limits: Limits,
) -> Peak {
    let mut tally = Tally::new(window, limits);
    for timing in timings {
        if tally.add(timing).is_none() {
            break;
        }
    }
    tally.peak()
}

/// A job as the report needs it: who it is, its expressions as written (to
/// suggest a rewrite) and its compiled timing (to count its fires).
#[derive(Clone, Debug)]
pub struct HotspotJob {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its cron expressions, in the order of `timing.timetables`.
    pub expressions: Vec<String>,
    /// When it fires.
    pub timing: Timing,
}

impl HotspotJob {
    /// What the report needs of a validated job.
    pub fn of(job: &Job) -> HotspotJob {
        HotspotJob {
            namespace: job.namespace.clone(),
            name: job.spec.name.clone(),
            expressions: job
                .spec
                .schedule
                .as_ref()
                .map(|s| s.as_slice().to_vec())
                .unwrap_or_default(),
            timing: job.timing(),
        }
    }
}

/// The report: the hot seconds of a window, busiest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The first instant covered.
    pub from: Timestamp,
    /// The first instant after the window.
    pub to: Timestamp,
    /// Jobs counted.
    pub jobs: usize,
    /// Their fires in the window.
    pub fires: u64,
    /// The largest number of fires due in one second of the window.
    pub peak_per_second: u32,
    /// Seconds at which two jobs or more fire, by count (descending), then
    /// time; at most the query's `top`.
    pub hotspots: Vec<Hotspot>,
    /// Set when a limit stopped the count (the jobs after it are missing).
    pub capped: Option<Cap>,
}

/// One second at which several jobs fire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hotspot {
    /// The second.
    pub at: Timestamp,
    /// How many jobs fire then.
    pub count: u32,
    /// The first [`JOBS_LISTED`] of them, in the order they were added.
    pub jobs: Vec<HotJob>,
    /// How to spread them, in a sentence.
    pub advice: String,
}

/// A job that fires at a hot second.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HotJob {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The expression that fires then (the first, if several do).
    pub expression: String,
    /// The expression spread with `H`, if it has a fixed minute or second
    /// (see [`spread`]).
    pub suggestion: Option<String>,
}

/// A report in the making: jobs are added one at a time (so that a caller
/// reading them from a store holds only those with fires in the window),
/// then [`Hotspots::finish`] picks the hot seconds.
#[derive(Clone, Debug)]
pub struct Hotspots {
    query: Query,
    tally: Tally,
    /// The jobs with fires in the window.
    jobs: Vec<HotspotJob>,
    /// Every fire counted: (offset in the window, index in `jobs`).
    fires: Vec<(u32, u32)>,
}

impl Hotspots {
    /// An empty report for `query`.
    pub fn new(query: Query, limits: Limits) -> Hotspots {
        Hotspots {
            query,
            tally: Tally::new(query.window, limits),
            jobs: Vec::new(),
            fires: Vec::new(),
        }
    }

    /// Counts one more job (a paused job does not fire: leave it out).
    /// Returns `false` once a limit is reached: nothing more is counted,
    /// and the caller may stop adding.
    pub fn add(&mut self, job: HotspotJob) -> bool {
        let Some(offsets) = self.tally.add(&job.timing) else {
            return false;
        };
        if !offsets.is_empty() {
            let index = u32::try_from(self.jobs.len()).expect("jobs are bounded by the limits");
            self.fires.extend(offsets.iter().map(|&o| (o, index)));
            self.jobs.push(job);
        }
        true
    }

    /// The report.
    pub fn finish(self) -> Report {
        let window = self.query.window;
        let peak = self.tally.peak();
        let mut hot: Vec<(u32, u32)> = self
            .tally
            .counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c >= 2)
            .map(|(offset, &c)| (c, offset as u32))
            .collect();
        hot.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        hot.truncate(self.query.top);
        let slot: HashMap<u32, usize> = hot.iter().enumerate().map(|(i, h)| (h.1, i)).collect();
        let mut listed: Vec<Vec<u32>> = vec![Vec::new(); hot.len()];
        for (offset, job) in &self.fires {
            if let Some(&i) = slot.get(offset) {
                if listed[i].len() < JOBS_LISTED {
                    listed[i].push(*job);
                }
            }
        }
        let hotspots = hot
            .iter()
            .zip(listed)
            .map(|(&(count, offset), jobs)| {
                let at = window.at(offset);
                let jobs: Vec<HotJob> = jobs
                    .iter()
                    .map(|&j| hot_job(&self.jobs[j as usize], at))
                    .collect();
                let advice = advice(count, &jobs);
                Hotspot {
                    at,
                    count,
                    jobs,
                    advice,
                }
            })
            .collect();
        Report {
            from: window.from(),
            to: window.to(),
            jobs: self.tally.jobs,
            fires: self.tally.fires,
            peak_per_second: peak.per_second,
            hotspots,
            capped: self.tally.capped,
        }
    }
}

/// The report over `jobs` (paused ones left out by the caller).
pub fn report(jobs: impl IntoIterator<Item = HotspotJob>, query: Query, limits: Limits) -> Report {
    let mut hotspots = Hotspots::new(query, limits);
    for job in jobs {
        if !hotspots.add(job) {
            break;
        }
    }
    hotspots.finish()
}

fn hot_job(job: &HotspotJob, at: Timestamp) -> HotJob {
    let expression = job
        .timing
        .timetables
        .iter()
        .zip(&job.expressions)
        .find(|(t, _)| t.matches(at))
        .map(|(_, e)| e.clone())
        .unwrap_or_default();
    HotJob {
        namespace: job.namespace.clone(),
        name: job.name.clone(),
        suggestion: spread(&expression),
        expression,
    }
}

fn advice(count: u32, jobs: &[HotJob]) -> String {
    let fixed = jobs.iter().filter(|j| j.suggestion.is_some()).count();
    if fixed > 0 {
        format!(
            "{count} jobs fire in this second. {fixed} of the {} listed have a fixed minute or second: \
             writing `H` in that field (as suggested) gives each job its own stable instant, \
             derived from its name, and spreads the load.",
            jobs.len()
        )
    } else {
        format!(
            "{count} jobs fire in this second, with no fixed minute or second to replace. \
             An expression can still be spread with `H`: `H/15` instead of `*/15`, `H(0-29)` \
             within a range, and `H` in the seconds of a 6-field expression."
        )
    }
}

/// `expression` rewritten with `H` where it fixes a minute or a second, so
/// that jobs sharing it fire at instants of their own: `0 * * * *` becomes
/// `H * * * *`, `*/15 * * * *` becomes `H/15 * * * *`, `0 0 * * * *`
/// becomes `H H * * * *`; a 5-field expression whose minute is not fixed
/// gets a hashed second (`* * * * *` becomes `H * * * * *`). Descriptors
/// become the fields they stand for (`@hourly` is `H * * * *`), and
/// `@every` the cron rhythm it matches when there is one (`@every 5m` is
/// `H/5 * * * *`). `None` when there is nothing to spread (hours, days and
/// lists are left as written) or the expression does not parse.
pub fn spread(expression: &str) -> Option<String> {
    let schedule = Schedule::parse(expression).ok()?;
    let ast = schedule.ast();
    let rewritten = if let Some(seconds) = ast.every_seconds() {
        format!("{}{}", prefix(expression, &schedule), every(seconds)?)
    } else if let Some(d) = ast.descriptor() {
        let fields = match d {
            Descriptor::Hourly => "H * * * *",
            Descriptor::Daily => "H 0 * * *",
            Descriptor::Weekly => "H 0 * * 0",
            Descriptor::Monthly => "H 0 1 * *",
            Descriptor::Yearly => "H 0 1 1 *",
        };
        format!("{}{fields}", prefix(expression, &schedule))
    } else {
        let second = ast.field(FieldKind::Second)?;
        let minute = ast.field(FieldKind::Minute)?;
        let mut edits = Vec::new();
        if let Some(h) = hashed(&minute) {
            edits.push((minute.span.start, minute.span.end, h));
        }
        if second.written {
            if let Some(h) = hashed(&second) {
                edits.push((second.span.start, second.span.end, h));
            }
        } else if edits.is_empty() && !minute.items.is_empty() {
            // Nothing to spread in the minute of a 5-field expression: give
            // it a hashed second (it becomes a 6-field one).
            edits.push((minute.span.start, minute.span.start, "H ".to_string()));
        }
        if edits.is_empty() {
            return None;
        }
        let mut text = expression.to_string();
        edits.sort_by_key(|e| std::cmp::Reverse(e.0));
        for (start, end, with) in edits {
            text.replace_range(start..end, &with);
        }
        text
    };
    // A rewrite is offered only if it is itself a valid expression.
    Schedule::parse(&rewritten).ok()?;
    (rewritten != expression).then_some(rewritten)
}

/// `H` or `H/n` for a field that is one fixed value or a step over the
/// whole field (`*/n`, `0/n`), which fix the instants within it.
fn hashed(field: &Field<'_>) -> Option<String> {
    let [item] = field.items else {
        return None;
    };
    match item.kind {
        ItemKind::Value(_) => Some("H".into()),
        ItemKind::Step {
            base: StepBase::Any,
            step,
        } => Some(format!("H/{step}")),
        ItemKind::Step {
            base: StepBase::From(start),
            step,
        } if start == field.kind.min() => Some(format!("H/{step}")),
        _ => None,
    }
}

/// The `CRON_TZ=` prefix as written, with the space after it.
fn prefix<'a>(expression: &'a str, schedule: &Schedule) -> &'a str {
    match schedule.ast().time_zone_prefix() {
        Some((_, span)) => {
            let start = expression.len() - expression.trim_start().len();
            let end = expression[span.end..]
                .find(|c: char| c != ' ' && c != '\t')
                .map_or(expression.len(), |i| span.end + i);
            &expression[start..end]
        }
        None => "",
    }
}

/// The cron rhythm of an `@every` period, with `H` for its offset: only
/// periods that divide a minute, an hour or a day evenly have one.
fn every(seconds: i64) -> Option<String> {
    let divides = |unit: i64, n: i64| n >= 2 && unit % n == 0;
    Some(match seconds {
        60 => "H * * * * *".into(),
        3600 => "H * * * *".into(),
        86_400 => "H H * * *".into(),
        s if divides(60, s) => format!("H/{s} * * * * *"),
        s if s % 60 == 0 && divides(60, s / 60) => format!("H/{} * * * *", s / 60),
        s if s % 3600 == 0 && divides(24, s / 3600) => format!("H H/{} * * *", s / 3600),
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
