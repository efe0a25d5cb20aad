//! The decisions of a namespace's quotas: which jobs of a file pass the
//! quota of schedules per job, whether a file's new jobs pass the quota of
//! jobs, whether a trigger passes the quota of unfinished runs, and the
//! token bucket behind the quota of triggers per second (and the limit of
//! failed authentications per address). Nothing here reads a store or a
//! clock: counts and instants come in, answers go out, and the API turns
//! each refusal into its error.

use std::time::Instant;

/// A namespace's quotas; each `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Jobs stored.
    pub max_jobs: Option<u32>,
    /// Schedules of one job.
    pub max_schedules_per_job: Option<u32>,
    /// Runs `pending` or `running`, on every node.
    pub max_active_runs: Option<u32>,
    /// Runs made by manual triggers, re-runs and backfills, per second.
    pub max_triggers_per_second: Option<u32>,
}

/// A job over the quota of schedules per job: its position in the file
/// and how many schedules it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooManySchedules {
    /// Its position among the file's jobs.
    pub index: usize,
    /// Its schedules.
    pub schedules: usize,
}

impl Limits {
    /// The jobs of a file (given by their numbers of schedules, in order)
    /// that have more schedules than the quota allows.
    pub fn too_many_schedules(
        &self,
        schedules: impl IntoIterator<Item = usize>,
    ) -> Vec<TooManySchedules> {
        let Some(max) = self.max_schedules_per_job else {
            return vec![];
        };
        schedules
            .into_iter()
            .enumerate()
            .filter(|(_, n)| *n > max as usize)
            .map(|(index, schedules)| TooManySchedules { index, schedules })
            .collect()
    }

    /// Whether `new` jobs that are not stored yet, beside `stored` stored
    /// ones, pass the quota of jobs. A file that adds no job always passes
    /// (it only changes jobs that are already counted).
    pub fn jobs_pass(&self, stored: usize, new: usize) -> bool {
        match self.max_jobs {
            Some(max) => new == 0 || stored + new <= max as usize,
            None => true,
        }
    }

    /// Whether a trigger of `runs` runs passes the quota of unfinished
    /// runs, with `unfinished` runs of the namespace not finished now.
    pub fn active_runs_pass(&self, unfinished: u64, runs: u32) -> bool {
        self.max_active_runs
            .is_none_or(|max| unfinished + u64::from(runs) <= u64::from(max))
    }
}

/// A token bucket holding at most `burst` tokens, refilled at `rate` a
/// second.
#[derive(Clone, Copy, Debug)]
pub struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket of `burst` tokens at `now`.
    pub fn full(burst: u32, now: Instant) -> Bucket {
        Bucket {
            tokens: f64::from(burst),
            at: now,
        }
    }

    /// Takes `n` tokens at `now` if the bucket has them, refilled at `rate`
    /// a second since it was last seen (never above `burst`); takes none
    /// otherwise.
    pub fn take(&mut self, rate: u32, burst: u32, now: Instant, n: u32) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * f64::from(rate)).min(f64::from(burst));
        self.at = now;
        if self.tokens >= f64::from(n) {
            self.tokens -= f64::from(n);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_bucket_allows_its_rate_and_refills_with_time() {
        let t0 = Instant::now();
        let mut b = Bucket::full(2, t0);
        assert!(b.take(2, 2, t0, 1));
        assert!(b.take(2, 2, t0, 1));
        assert!(!b.take(2, 2, t0, 1), "two a second");
        assert!(!b.take(2, 2, t0 + Duration::from_millis(400), 1));
        assert!(b.take(2, 2, t0 + Duration::from_millis(500), 1), "refilled");
        // A long pause refills to one second's worth, no more.
        let later = t0 + Duration::from_secs(60);
        assert!(b.take(2, 2, later, 1) && b.take(2, 2, later, 1));
        assert!(!b.take(2, 2, later, 1));
    }

    #[test]
    fn a_batch_takes_a_token_per_run_or_none() {
        let t0 = Instant::now();
        let mut b = Bucket::full(5, t0);
        assert!(
            !b.take(5, 5, t0, 6),
            "more than a second's worth never passes"
        );
        assert!(b.take(5, 5, t0, 3));
        assert!(!b.take(5, 5, t0, 3), "two left");
        assert!(b.take(5, 5, t0, 2));
        assert!(b.take(5, 5, t0 + Duration::from_secs(1), 5), "refilled");
    }

    #[test]
    fn no_limit_passes_everything() {
        let none = Limits::default();
        assert!(none.too_many_schedules([1000, 5000]).is_empty());
        assert!(none.jobs_pass(usize::MAX / 2, 1000));
        assert!(none.active_runs_pass(u64::MAX / 2, u32::MAX));
    }

    #[test]
    fn each_quota_counts_what_it_names() {
        let q = Limits {
            max_jobs: Some(3),
            max_schedules_per_job: Some(2),
            max_active_runs: Some(10),
            max_triggers_per_second: None,
        };
        assert_eq!(
            q.too_many_schedules([1, 3, 2, 4]),
            [
                TooManySchedules {
                    index: 1,
                    schedules: 3
                },
                TooManySchedules {
                    index: 3,
                    schedules: 4
                }
            ]
        );
        assert!(q.jobs_pass(2, 1));
        assert!(!q.jobs_pass(2, 2));
        assert!(
            q.jobs_pass(5, 0),
            "a namespace already over its quota may still change its jobs"
        );
        assert!(q.active_runs_pass(9, 1));
        assert!(!q.active_runs_pass(9, 2));
        assert!(!q.active_runs_pass(10, 1));
    }
}
