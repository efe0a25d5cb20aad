//! Retry policy: which failures are retried, and after what delay
//! (fixed or exponential backoff, capped, with jitter).
//!
//! Randomness is an argument (`rand: u64`), so that the policy stays pure and
//! a test can pin every delay.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::Dur;
use crate::model::{RetryOverride, RetrySpec, ValidationError};

/// How delays grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backoff {
    /// Every delay is `initial`.
    Fixed,
    /// `initial * factor^(n-1)`, capped at `max`.
    Exponential,
}

/// Randomization of a delay `d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Jitter {
    /// Exactly `d`.
    None,
    /// Uniform in `[0, d]`.
    Full,
    /// Uniform in `[d/2, d]`.
    Equal,
    /// Uniform in `[d - p%, d + p%]`, then capped.
    Percent(u8),
}

/// Which failures are worth another attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryOn {
    /// Exit codes that are retried; empty means every non-zero code.
    pub exit_codes: Vec<i32>,
    /// HTTP statuses that are retried; empty means every unexpected status.
    pub http_statuses: Vec<u16>,
    /// Whether an attempt that timed out is retried.
    pub timeouts: bool,
    /// Whether an attempt whose worker vanished is retried (under at-least-once delivery).
    pub lost: bool,
    /// Whether errors before the task ran (spawn failure, connection refused) are retried.
    pub errors: bool,
}

impl Default for RetryOn {
    fn default() -> RetryOn {
        RetryOn {
            exit_codes: vec![],
            http_statuses: vec![],
            timeouts: true,
            lost: true,
            errors: true,
        }
    }
}

/// How an attempt failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// A process exited with a non-zero code (or was killed: code is then None).
    Exit(Option<i32>),
    /// An HTTP call answered an unexpected status.
    HttpStatus(u16),
    /// The attempt ran past its timeout.
    Timeout,
    /// The worker or node running it vanished.
    Lost,
    /// It could not start or reach its target.
    Error(String),
}

/// The effective retry policy of a task.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in total, including the first.
    pub max_attempts: u32,
    /// Growth of delays.
    pub backoff: Backoff,
    /// The first delay.
    pub initial: Duration,
    /// Growth factor.
    pub factor: f64,
    /// Cap.
    pub max: Duration,
    /// Randomization.
    pub jitter: Jitter,
    /// Retryable failures.
    pub retry_on: RetryOn,
}

/// What to do after a failed attempt.
#[derive(Clone, Debug, PartialEq)]
pub enum RetryDecision {
    /// Start attempt `attempt + 1` after this delay.
    Retry(Duration),
    /// Stop; the task fails. The reason says why no retry.
    GiveUp(&'static str),
}

impl RetryPolicy {
    /// The policy of a validated spec.
    pub fn from_spec(spec: &RetrySpec) -> RetryPolicy {
        RetryPolicy {
            max_attempts: spec.max_attempts,
            backoff: spec.backoff,
            initial: spec.initial.0,
            factor: spec.factor,
            max: spec.max.0,
            jitter: spec.jitter,
            retry_on: spec.retry_on.clone(),
        }
    }

    /// Whether this kind of failure is retried at all.
    pub fn retryable(&self, failure: &Failure) -> bool {
        let on = &self.retry_on;
        match failure {
            Failure::Exit(Some(code)) => on.exit_codes.is_empty() || on.exit_codes.contains(code),
            Failure::Exit(None) => on.exit_codes.is_empty(),
            Failure::HttpStatus(s) => on.http_statuses.is_empty() || on.http_statuses.contains(s),
            Failure::Timeout => on.timeouts,
            Failure::Lost => on.lost,
            Failure::Error(_) => on.errors,
        }
    }

    /// The delay before the attempt after attempt `n` (1-based), before jitter.
    pub fn base_delay(&self, n: u32) -> Duration {
        let d = match self.backoff {
            Backoff::Fixed => self.initial,
            Backoff::Exponential => {
                let secs = self.initial.as_secs_f64()
                    * self.factor.powi(n.saturating_sub(1).min(1000) as i32);
                if secs.is_finite() && secs < self.max.as_secs_f64() {
                    Duration::from_secs_f64(secs)
                } else {
                    self.max
                }
            }
        };
        d.min(self.max)
    }

    /// The delay after attempt `n`, with jitter drawn from `rand`.
    pub fn delay(&self, n: u32, rand: u64) -> Duration {
        let base = self.base_delay(n);
        let u = rand as f64 / u64::MAX as f64; // in [0, 1]
        let d = match self.jitter {
            Jitter::None => base,
            Jitter::Full => base.mul_f64(u),
            Jitter::Equal => base / 2 + (base / 2).mul_f64(u),
            Jitter::Percent(p) => {
                let spread = base.as_secs_f64() * f64::from(p) / 100.0;
                Duration::from_secs_f64((base.as_secs_f64() - spread + 2.0 * spread * u).max(0.0))
            }
        };
        d.min(self.max)
    }

    /// After attempt `n` failed with `failure`: retry, and when, or give up.
    pub fn decide(&self, n: u32, failure: &Failure, rand: u64) -> RetryDecision {
        if !self.retryable(failure) {
            return RetryDecision::GiveUp("the failure is not retryable under retry_on");
        }
        if n >= self.max_attempts {
            return RetryDecision::GiveUp("max_attempts reached");
        }
        RetryDecision::Retry(self.delay(n, rand))
    }
}

/// A job default merged with a task's override.
pub(crate) fn merge(job: &RetrySpec, task: Option<&RetryOverride>) -> RetrySpec {
    let Some(t) = task else { return job.clone() };
    RetrySpec {
        max_attempts: t.max_attempts.unwrap_or(job.max_attempts),
        backoff: t.backoff.unwrap_or(job.backoff),
        initial: t.initial.unwrap_or(job.initial),
        factor: t.factor.unwrap_or(job.factor),
        max: t.max.unwrap_or(job.max),
        jitter: t.jitter.unwrap_or(job.jitter),
        retry_on: t.retry_on.clone().unwrap_or_else(|| job.retry_on.clone()),
    }
}

/// Problems of a retry spec.
pub(crate) fn check_spec(spec: &RetrySpec, at: &str) -> Vec<ValidationError> {
    let mut errors = Vec::new();
    let mut err = |field: &str, message: String| {
        errors.push(ValidationError {
            path: format!("{at}.{field}"),
            message,
            span: None,
        })
    };
    if !(1..=1000).contains(&spec.max_attempts) {
        err(
            "max_attempts",
            format!(
                "{} is out of range: attempts in total, 1 (no retry) to 1000",
                spec.max_attempts
            ),
        );
    }
    if !spec.factor.is_finite() || spec.factor < 1.0 || spec.factor > 100.0 {
        err(
            "factor",
            format!(
                "{} is out of range: a growth factor from 1.0 to 100.0",
                spec.factor
            ),
        );
    }
    if spec.initial > spec.max {
        err(
            "initial",
            format!(
                "initial delay {} is longer than max {}",
                spec.initial, spec.max
            ),
        );
    }
    if spec.max > Dur::from_secs(7 * 86_400) {
        err(
            "max",
            format!("{} is longer than 7d, the longest retry delay", spec.max),
        );
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy(jitter: Jitter) -> RetryPolicy {
        RetryPolicy::from_spec(&RetrySpec {
            max_attempts: 6,
            initial: Dur::from_secs(2),
            factor: 2.0,
            max: Dur::from_secs(30),
            jitter,
            ..RetrySpec::default()
        })
    }

    #[test]
    fn exponential_backoff_is_capped() {
        let p = policy(Jitter::None);
        let delays: Vec<u64> = (1..=6).map(|n| p.delay(n, 0).as_secs()).collect();
        assert_eq!(delays, [2, 4, 8, 16, 30, 30]);
        let fixed = RetryPolicy {
            backoff: Backoff::Fixed,
            ..p
        };
        assert_eq!(fixed.delay(5, 0), Duration::from_secs(2));
    }

    #[test]
    fn decisions() {
        let p = policy(Jitter::None);
        assert_eq!(
            p.decide(1, &Failure::Exit(Some(1)), 0),
            RetryDecision::Retry(Duration::from_secs(2))
        );
        assert_eq!(
            p.decide(6, &Failure::Exit(Some(1)), 0),
            RetryDecision::GiveUp("max_attempts reached")
        );
        let only_75 = RetryPolicy {
            retry_on: RetryOn {
                exit_codes: vec![75],
                ..RetryOn::default()
            },
            ..p.clone()
        };
        assert!(matches!(
            only_75.decide(1, &Failure::Exit(Some(1)), 0),
            RetryDecision::GiveUp(_)
        ));
        assert!(matches!(
            only_75.decide(1, &Failure::Exit(Some(75)), 0),
            RetryDecision::Retry(_)
        ));
        let no_timeouts = RetryPolicy {
            retry_on: RetryOn {
                timeouts: false,
                ..RetryOn::default()
            },
            ..p
        };
        assert!(matches!(
            no_timeouts.decide(1, &Failure::Timeout, 0),
            RetryDecision::GiveUp(_)
        ));
    }

    proptest! {
        /// Every delay lies within the jitter's bounds and never exceeds the cap.
        #[test]
        fn jitter_bounds(n in 1u32..40, rand in any::<u64>(), kind in 0..4u8, pct in 1u8..=100) {
            let jitter = [Jitter::None, Jitter::Full, Jitter::Equal, Jitter::Percent(pct)][kind as usize];
            let p = policy(jitter);
            let base = p.base_delay(n);
            let d = p.delay(n, rand);
            prop_assert!(d <= p.max);
            let (lo, hi) = match jitter {
                Jitter::None => (base, base),
                Jitter::Full => (Duration::ZERO, base),
                Jitter::Equal => (base / 2, base),
                Jitter::Percent(p) => (base.mul_f64(1.0 - f64::from(p) / 100.0), base.mul_f64(1.0 + f64::from(p) / 100.0)),
            };
            let eps = Duration::from_micros(1);
            prop_assert!(d + eps >= lo && d <= hi + eps, "{:?} outside [{:?}, {:?}]", d, lo, hi);
        }

        /// Without jitter, delays never shrink from one attempt to the next.
        #[test]
        fn backoff_is_monotonic(n in 1u32..60, factor in 1.0f64..10.0) {
            let p = RetryPolicy { factor, ..policy(Jitter::None) };
            prop_assert!(p.delay(n, 0) <= p.delay(n + 1, 0));
        }
    }
}
