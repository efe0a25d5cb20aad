//! The failure breaker: a job whose last runs all failed stops firing
//! until an operator resumes it.
//!
//! `breaker: { after_failures: 3 }` opens the breaker once the job's last
//! three runs that ended succeeded or failed all failed (a cancelled run
//! counts for neither side). While it is open, each scheduled fire is
//! recorded in the ledger as `skipped_breaker` and makes no run; a trigger
//! by hand still makes one. Resuming the job closes it, and only runs made
//! after that count towards opening it again.
//!
//! The decision is pure ([`opens`]); the store applies it to the job's
//! runs in the transaction that records the failed run's end, so that two
//! nodes ending runs of one job at once count each other's (see
//! `dagcron_store::Write::Breaker`).

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::model::ValidationError;
use crate::state::RunState;

/// The most consecutive failures a breaker may wait for.
pub const MAX_AFTER_FAILURES: u32 = 1000;

/// A job's `breaker`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerSpec {
    /// Open after this many consecutive failed runs.
    pub after_failures: u32,
}

impl BreakerSpec {
    /// Every problem of the breaker, at `at`.
    pub fn check(&self, at: &str) -> Vec<ValidationError> {
        if (1..=MAX_AFTER_FAILURES).contains(&self.after_failures) {
            return vec![];
        }
        vec![ValidationError {
            path: format!("{at}.after_failures"),
            message: format!(
                "{} is out of range: a breaker opens after 1 to {MAX_AFTER_FAILURES} consecutive failed runs",
                self.after_failures
            ),
            span: None,
        }]
    }
}

/// An open breaker, as the job records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenBreaker {
    /// When it opened.
    pub opened_at: Timestamp,
    /// The failed run that opened it.
    pub run: i64,
    /// The consecutive failed runs it opened after.
    pub failures: u32,
}

impl OpenBreaker {
    /// Why the job does not fire, in words.
    pub fn reason(&self) -> String {
        format!(
            "the failure breaker opened at {} after {} consecutive failed runs (the last: run {}); resume the job to close it",
            self.opened_at, self.failures, self.run
        )
    }
}

/// Whether the breaker of a job opens after `after_failures` consecutive
/// failures, given the states of its latest runs that ended succeeded or
/// failed since it last closed, newest first (only the first
/// `after_failures` are looked at).
pub fn opens(latest: &[RunState], after_failures: u32) -> bool {
    let n = after_failures as usize;
    n > 0 && latest.len() >= n && latest[..n].iter().all(|s| *s == RunState::Failed)
}

/// Whether a run that ended in `state` counts for the breaker.
pub fn counts(state: RunState) -> bool {
    matches!(state, RunState::Succeeded | RunState::Failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use RunState::{Failed as F, Succeeded as S};
    use proptest::prelude::*;

    #[test]
    fn it_opens_after_exactly_n_failures_in_a_row() {
        assert!(!opens(&[], 3));
        assert!(!opens(&[F, F], 3), "two of three");
        assert!(opens(&[F, F, F], 3));
        assert!(opens(&[F, F, F, S], 3), "older runs do not matter");
        assert!(!opens(&[F, S, F, F], 3), "a success between resets it");
        assert!(opens(&[F], 1));
        assert!(!opens(&[F], 0), "no breaker");
    }

    #[test]
    fn its_bounds_are_checked_at_their_path() {
        let err = BreakerSpec { after_failures: 0 }.check("jobs[0].breaker");
        assert_eq!(err[0].path, "jobs[0].breaker.after_failures");
        assert!(err[0].message.contains("1 to 1000"), "{}", err[0].message);
        assert_eq!(
            BreakerSpec {
                after_failures: 1001
            }
            .check("b")
            .len(),
            1
        );
        assert!(BreakerSpec { after_failures: 3 }.check("b").is_empty());
    }

    #[test]
    fn only_successes_and_failures_count() {
        assert!(counts(S) && counts(F));
        for s in [
            RunState::Cancelled,
            RunState::Skipped,
            RunState::Running,
            RunState::Pending,
            RunState::Planned,
        ] {
            assert!(!counts(s), "{s:?}");
        }
    }

    proptest! {
        /// Runs ending one after another, counted as the store does: the
        /// breaker opens at the first run that ends the N-th failure in a
        /// row, and never before.
        #[test]
        fn it_opens_at_the_nth_failure_in_a_row(ends in proptest::collection::vec(any::<bool>(), 0..60), n in 1u32..6) {
            let mut newest_first: Vec<RunState> = Vec::new();
            let mut streak = 0u32;
            for failed in ends {
                newest_first.insert(0, if failed { F } else { S });
                streak = if failed { streak + 1 } else { 0 };
                prop_assert_eq!(opens(&newest_first, n), streak >= n);
            }
        }
    }
}
