//! Decisions about fires: what a fire ledger row says, catch-up (misfire),
//! the namespace's fire quota, a run's outcome. What one more run of a
//! job does under its overlap policy is the job machine's ([`crate::job`]).

use jiff::Timestamp;

use crate::model::Misfire;
use crate::state::{RunState, TaskState};

/// What to do with a fire, given the runs already active.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FireDecision {
    /// Create a run and start it.
    Start,
    /// Create a run and keep it pending until a slot frees.
    Queue,
    /// Create no run; record the fire as skipped by the overlap policy.
    Skip,
    /// Cancel the active runs, then start a new one.
    Replace,
    /// Create no run: as many runs wait as the job allows
    /// (`max_pending_runs`); record the fire as skipped by the backlog.
    Backlog,
}

/// Whether a job is paused after an apply, given its state before (`None`
/// for a new job: whether it is paused, and the `paused` of the file last
/// applied) and the `paused` of the file applied now.
///
/// The file decides when it is new or when its `paused` changed; otherwise
/// the job keeps its state, so that a pause or resume made through the API
/// survives re-applying the same file, or a file changed elsewhere.
pub fn paused_after_apply(before: Option<(bool, bool)>, file_paused: bool) -> bool {
    match before {
        None => file_paused,
        Some((_, previous_file)) if previous_file != file_paused => file_paused,
        Some((paused, _)) => paused,
    }
}

/// The outcome of an expected fire, as the fire ledger records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FireOutcome {
    /// On time: a run was created.
    Fired,
    /// Declined by the overlap policy: a run was active under
    /// `concurrency: forbid`, or one was already waiting under `buffer_one`.
    SkippedOverlap,
    /// Missed during downtime or a pause, then run by the misfire policy.
    MissedCaughtUp,
    /// Missed during downtime or a pause, and not run.
    MissedSkipped,
    /// Suppressed: the job was paused when it came due.
    Suppressed,
    /// Declined because as many runs of the job were waiting as it allows
    /// (`max_pending_runs`): the backlog.
    SkippedBacklog,
    /// Declined because the job's namespace had made as many scheduled
    /// fires this second as its quota allows (see [`FireBucket`]).
    SkippedQuota,
    /// Declined because the job's failure breaker was open (see
    /// [`crate::breaker`]).
    SkippedBreaker,
}

impl FireOutcome {
    /// Every outcome.
    pub const ALL: [FireOutcome; 8] = [
        FireOutcome::Fired,
        FireOutcome::SkippedOverlap,
        FireOutcome::MissedCaughtUp,
        FireOutcome::MissedSkipped,
        FireOutcome::Suppressed,
        FireOutcome::SkippedBacklog,
        FireOutcome::SkippedQuota,
        FireOutcome::SkippedBreaker,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            FireOutcome::Fired => "fired",
            FireOutcome::SkippedOverlap => "skipped_overlap",
            FireOutcome::MissedCaughtUp => "missed_caught_up",
            FireOutcome::MissedSkipped => "missed_skipped",
            FireOutcome::Suppressed => "suppressed",
            FireOutcome::SkippedBacklog => "skipped_backlog",
            FireOutcome::SkippedQuota => "skipped_quota",
            FireOutcome::SkippedBreaker => "skipped_breaker",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<FireOutcome> {
        FireOutcome::ALL.into_iter().find(|o| o.as_str() == s)
    }
}

/// A namespace's allowance of scheduled fires: a token bucket that holds
/// at most one second's worth, refilled at the quota's rate. A fire that
/// finds it empty makes no run and is recorded `skipped_quota`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FireBucket {
    tokens: f64,
    at: Timestamp,
}

impl FireBucket {
    /// A full bucket for `rate` fires a second.
    pub fn full(rate: u32, now: Timestamp) -> FireBucket {
        FireBucket {
            tokens: f64::from(rate),
            at: now,
        }
    }

    /// Takes one fire at `now` if there is one left, after refilling at
    /// `rate` a second since the bucket was last seen (an instant before
    /// that refills nothing).
    pub fn take(&mut self, rate: u32, now: Timestamp) -> bool {
        if self.ready(rate, now) {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whether a fire at `now` would be taken (refilled as by
    /// [`FireBucket::take`], nothing taken).
    pub fn ready(&mut self, rate: u32, now: Timestamp) -> bool {
        let elapsed = now.duration_since(self.at).as_secs_f64().max(0.0);
        self.tokens = (self.tokens + elapsed * f64::from(rate)).min(f64::from(rate));
        if now > self.at {
            self.at = now;
        }
        self.tokens >= 1.0
    }
}

/// Which of the missed fires (in increasing order) to run.
pub fn catch_up(
    missed: &[Timestamp],
    policy: Misfire,
    max_catchup: u32,
) -> Vec<(Timestamp, FireOutcome)> {
    let keep = match policy {
        Misfire::Skip => 0,
        Misfire::RunOnce => 1,
        Misfire::RunAll => max_catchup as usize,
    };
    let first_run = missed.len().saturating_sub(keep);
    missed
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (
                *t,
                if i >= first_run {
                    FireOutcome::MissedCaughtUp
                } else {
                    FireOutcome::MissedSkipped
                },
            )
        })
        .collect()
}

/// The final state of a run whose tasks are all finished, or `None` while
/// some task is still going.
pub fn run_outcome(tasks: &[TaskState]) -> Option<RunState> {
    if !tasks.iter().all(|t| t.is_terminal()) {
        return None;
    }
    let bad = tasks
        .iter()
        .any(|t| matches!(t, TaskState::Failed | TaskState::UpstreamFailed));
    let cancelled = tasks.contains(&TaskState::Cancelled);
    Some(if bad {
        RunState::Failed
    } else if cancelled {
        RunState::Cancelled
    } else {
        RunState::Succeeded
    })
}

/// Whether the server's ready backlog (`total` tasks waiting for a worker,
/// at most `limit` by default) takes `runs` more runs made by hand in a
/// namespace that has `own` of the waiting tasks, while `others` other
/// namespaces have some too. Within the limit, always; past it, a
/// namespace still under its share (the limit split evenly between the
/// namespaces waiting) is let in, up to twice the limit in all, so that one
/// namespace's backlog (a large fan-out, say) does not refuse the others'.
pub fn backlog_admits(limit: usize, total: usize, own: usize, others: usize, runs: usize) -> bool {
    if total + runs <= limit {
        return true;
    }
    let share = limit / (others + 1);
    own + runs <= share && total + runs <= limit.saturating_mul(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_under_its_share_of_a_full_backlog_is_let_in() {
        // Within the limit: yes, whoever holds it.
        assert!(backlog_admits(100, 99, 99, 0, 1));
        // Full, all of it one namespace's: that one is refused ...
        assert!(!backlog_admits(100, 100, 100, 0, 1));
        // ... another one with nothing waiting is let in (its share is 50).
        assert!(backlog_admits(100, 100, 0, 1, 1));
        assert!(backlog_admits(100, 149, 49, 1, 1));
        assert!(!backlog_admits(100, 150, 50, 1, 1), "its share is used");
        // Three namespaces waiting: a share of 33 each.
        assert!(backlog_admits(100, 120, 32, 2, 1));
        assert!(!backlog_admits(100, 120, 33, 2, 1));
        // Never past twice the limit.
        assert!(!backlog_admits(100, 200, 0, 1, 1));
        assert!(!backlog_admits(0, 0, 0, 0, 1));
    }

    /// 8,760 seconds of a namespace firing 600 jobs every second against a
    /// quota of 100 a second, simulated: exactly 100 fires pass each second;
    /// a pause of ten years after refills one second's worth, no more.
    #[test]
    fn the_fire_quota_lets_its_rate_through_each_second() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let mut bucket = FireBucket::full(100, t0);
        for second in 0..8760 {
            let at = t0 + jiff::SignedDuration::from_secs(second);
            let passed = (0..600).filter(|_| bucket.take(100, at)).count();
            assert_eq!(passed, 100, "second {second}");
        }
        let later = t0 + jiff::SignedDuration::from_secs(10 * 365 * 24 * 3600);
        let passed = (0..600).filter(|_| bucket.take(100, later)).count();
        assert_eq!(passed, 100, "a long pause refills one second's worth");
        // A clock that steps back refills nothing.
        let earlier = later - jiff::SignedDuration::from_secs(5);
        assert!(!bucket.take(100, earlier));
    }

    #[test]
    fn the_file_decides_pause_only_when_new_or_when_its_paused_changed() {
        // New job: as the file says.
        assert!(paused_after_apply(None, true));
        assert!(!paused_after_apply(None, false));
        // Paused through the API, the same file applied again: stays paused.
        assert!(paused_after_apply(Some((true, false)), false));
        // Resumed through the API, a file still saying `paused: true`: stays resumed.
        assert!(!paused_after_apply(Some((false, true)), true));
        // The file's `paused` changed: it wins.
        assert!(paused_after_apply(Some((false, false)), true));
        assert!(!paused_after_apply(Some((true, true)), false));
    }

    #[test]
    fn catch_up_policies() {
        let t = |s: i64| Timestamp::from_second(s).unwrap();
        let missed = [t(1), t(2), t(3), t(4)];
        let run = |p, n| {
            catch_up(&missed, p, n)
                .iter()
                .filter(|x| x.1 == FireOutcome::MissedCaughtUp)
                .map(|x| x.0.as_second())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(Misfire::Skip, 10), Vec::<i64>::new());
        assert_eq!(run(Misfire::RunOnce, 10), [4]);
        assert_eq!(run(Misfire::RunAll, 10), [1, 2, 3, 4]);
        assert_eq!(run(Misfire::RunAll, 2), [3, 4]);
        assert_eq!(
            catch_up(&missed, Misfire::RunAll, 2).len(),
            4,
            "every missed fire is recorded"
        );
    }

    #[test]
    fn run_outcomes() {
        use TaskState::*;
        assert_eq!(run_outcome(&[Succeeded, Running]), None);
        assert_eq!(
            run_outcome(&[Succeeded, Skipped]),
            Some(RunState::Succeeded)
        );
        assert_eq!(run_outcome(&[Failed, Succeeded]), Some(RunState::Failed));
        assert_eq!(
            run_outcome(&[Succeeded, UpstreamFailed]),
            Some(RunState::Failed)
        );
        assert_eq!(
            run_outcome(&[Succeeded, Cancelled]),
            Some(RunState::Cancelled)
        );
    }
}
