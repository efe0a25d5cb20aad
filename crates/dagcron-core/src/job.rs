//! The job machine: what one job does with a scheduled fire, a trigger
//! asking for runs, the instant of a planned run, and a slot that frees,
//! given its policies and the runs it has.
//!
//! The engine keeps a job's runs; the machine sees only how many run and
//! how many wait ([`JobRuns`]), and decides: make a run and start it,
//! queue it, replace the runs going on, or make none and say why (the
//! outcome the fire ledger records, or the refusal a caller reads). The
//! failure breaker, the overlap policy, the backlog (`max_pending_runs`),
//! the namespace's fire quota and the misfire policy of a planned run are decided here and
//! nowhere else; when fires come due, which ones were missed and when the
//! next one is are [`crate::fires`]' decisions.

use crate::model::{Concurrency, JobSpec, Misfire};
use crate::policy::{FireDecision, FireOutcome};

/// The policies of a job that the machine applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobPolicy {
    /// What happens to a run while others go on.
    pub concurrency: Concurrency,
    /// Runs active at once ([`JobSpec::max_active`]).
    pub max_active: u32,
    /// Runs that may wait for a slot ([`JobSpec::max_pending`]).
    pub max_pending: u32,
    /// What happens to a fire, or a planned run, whose instant passed while
    /// the server was down.
    pub misfire: Misfire,
}

impl JobPolicy {
    /// The policies of `spec`.
    pub fn of(spec: &JobSpec) -> JobPolicy {
        JobPolicy {
            concurrency: spec.concurrency,
            max_active: spec.max_active(),
            max_pending: spec.max_pending(),
            misfire: spec.misfire,
        }
    }
}

/// The runs of one job, as the machine counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobRuns {
    /// Runs active: begun and not ended, on this node or on others.
    pub running: u32,
    /// Runs waiting for a slot (queued, or waiting for the runs they
    /// replace to end).
    pub waiting: u32,
}

/// What a scheduled fire, or a planned run whose instant came, does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fire {
    /// A run is made: started, queued, or replacing the runs going on
    /// ([`FireDecision::Start`], [`FireDecision::Queue`],
    /// [`FireDecision::Replace`]).
    Make(FireDecision),
    /// No run is made, for the reason the ledger records.
    Skip(FireOutcome),
}

/// Why a trigger asking for runs is refused, all of its runs together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// As many runs wait as the job allows (`max_pending_runs`).
    Backlog {
        /// The runs waiting, counting those of this trigger before it.
        waiting: u32,
        /// The runs of this trigger before the one refused.
        ahead: u32,
    },
    /// The overlap policy declines a run while one goes on (`forbid`), or
    /// while one already waits (`buffer_one`).
    Overlap {
        /// The runs of this trigger before the one refused.
        ahead: u32,
    },
    /// Under `replace`, each run of the trigger would cancel the one
    /// before it.
    ReplaceMany,
}

/// The overlap decision for one more run of a job with `runs`, by its
/// policy; `Skip` and `Backlog` make no run.
fn overlap(policy: &JobPolicy, runs: JobRuns) -> FireDecision {
    let decision = match policy.concurrency {
        Concurrency::Allow | Concurrency::Queue if runs.running < policy.max_active => {
            FireDecision::Start
        }
        Concurrency::Allow | Concurrency::Queue => FireDecision::Queue,
        Concurrency::Forbid if runs.running > 0 => FireDecision::Skip,
        Concurrency::Forbid => FireDecision::Start,
        Concurrency::Replace if runs.running > 0 => FireDecision::Replace,
        Concurrency::Replace => FireDecision::Start,
        // One waits at most: it is the next to start, so nothing may be
        // started or queued beside it, even in the instant between the
        // active run's end and its start.
        Concurrency::BufferOne if runs.waiting > 0 => FireDecision::Skip,
        Concurrency::BufferOne if runs.running > 0 => FireDecision::Queue,
        Concurrency::BufferOne => FireDecision::Start,
    };
    match decision {
        FireDecision::Queue | FireDecision::Replace if runs.waiting >= policy.max_pending => {
            FireDecision::Backlog
        }
        decision => decision,
    }
}

/// The fire's outcome in the ledger for a decision that makes no run.
fn skipped(decision: FireDecision) -> Fire {
    match decision {
        FireDecision::Skip => Fire::Skip(FireOutcome::SkippedOverlap),
        FireDecision::Backlog => Fire::Skip(FireOutcome::SkippedBacklog),
        make => Fire::Make(make),
    }
}

/// A scheduled fire of a job with `runs`; `breaker_open`: the job's
/// failure breaker is open ([`crate::breaker`]); `within_quota` is whether
/// its namespace's fire quota has room for it (see
/// [`crate::policy::FireBucket`]), asked only if the breaker is closed.
pub fn on_fire(
    policy: &JobPolicy,
    runs: JobRuns,
    breaker_open: bool,
    within_quota: impl FnOnce() -> bool,
) -> Fire {
    if breaker_open {
        return Fire::Skip(FireOutcome::SkippedBreaker);
    }
    if !within_quota() {
        return Fire::Skip(FireOutcome::SkippedQuota);
    }
    skipped(overlap(policy, runs))
}

/// The instant of a planned run of a job with `runs` came; `missed`: it
/// passed more than the misfire grace ago (the server was down), which
/// skips it under `misfire: skip`. A planned run skipped is recorded as
/// skipped, with no fire ledger row (it was asked for, not scheduled).
pub fn on_planned_due(policy: &JobPolicy, runs: JobRuns, missed: bool) -> Fire {
    if missed && policy.misfire == Misfire::Skip {
        return Fire::Skip(FireOutcome::MissedSkipped);
    }
    skipped(overlap(policy, runs))
}

/// A trigger asks for `count` runs of a job with `runs`: what each does,
/// or why all are refused (each run counts against the policy as the
/// runs of the trigger before it are started or queued).
pub fn on_trigger(
    policy: &JobPolicy,
    mut runs: JobRuns,
    count: usize,
) -> Result<Vec<FireDecision>, Refusal> {
    if count > 1 && policy.concurrency == Concurrency::Replace {
        return Err(Refusal::ReplaceMany);
    }
    let mut decisions = Vec::with_capacity(count);
    for ahead in 0..count as u32 {
        let decision = overlap(policy, runs);
        match decision {
            FireDecision::Backlog => {
                return Err(Refusal::Backlog {
                    waiting: runs.waiting,
                    ahead,
                });
            }
            FireDecision::Skip => return Err(Refusal::Overlap { ahead }),
            // Once begun, the run is active; once queued, waiting.
            FireDecision::Start => runs.running += 1,
            FireDecision::Queue | FireDecision::Replace => runs.waiting += 1,
        }
        decisions.push(decision);
    }
    Ok(decisions)
}

/// Whether the first waiting run, of a version allowing `max_active`
/// runs, may start now that the job has `runs`.
pub fn may_start(max_active: u32, runs: JobRuns) -> bool {
    runs.waiting > 0 && runs.running < max_active
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy(concurrency: Concurrency, max_active: u32, max_pending: u32) -> JobPolicy {
        JobPolicy {
            concurrency,
            max_active,
            max_pending,
            misfire: Misfire::RunOnce,
        }
    }

    fn runs(running: u32, waiting: u32) -> JobRuns {
        JobRuns { running, waiting }
    }

    /// The overlap decision under `concurrency` with `max_active` runs
    /// allowed, `active` running, `waiting` waiting and `max_pending` allowed to wait.
    fn decide(
        concurrency: Concurrency,
        max_active: u32,
        active: u32,
        waiting: u32,
        max_pending: u32,
    ) -> FireDecision {
        overlap(
            &policy(concurrency, max_active, max_pending),
            runs(active, waiting),
        )
    }

    #[test]
    fn overlap_decisions() {
        use Concurrency::*;
        use FireDecision as D;
        // (policy, max_active_runs, active, waiting, decision)
        let cases = [
            (Allow, 2, 0, 0, D::Start),
            (Allow, 2, 2, 0, D::Queue),
            (Allow, 2, 2, 5, D::Queue),
            (Forbid, 5, 1, 0, D::Skip),
            (Forbid, 5, 0, 0, D::Start),
            (Replace, 1, 1, 0, D::Replace),
            (Replace, 1, 0, 0, D::Start),
            (Queue, 1, 1, 0, D::Queue),
            (Queue, 1, 1, 3, D::Queue),
            (Queue, 1, 0, 0, D::Start),
            // Nothing runs: start.
            (BufferOne, 1, 0, 0, D::Start),
            // One runs: the next waits behind it.
            (BufferOne, 1, 1, 0, D::Queue),
            // One runs and one waits: skipped.
            (BufferOne, 1, 1, 1, D::Skip),
            // The waiting one is about to start: still the only one waiting.
            (BufferOne, 1, 0, 1, D::Skip),
            // More waiting than one (a backfill queued them): skipped.
            (BufferOne, 1, 1, 4, D::Skip),
            // `max_active_runs` does not widen it.
            (BufferOne, 5, 1, 0, D::Queue),
        ];
        for (policy, max, active, waiting, want) in cases {
            assert_eq!(
                decide(policy, max, active, waiting, 100),
                want,
                "{policy:?} max={max} active={active} waiting={waiting}"
            );
        }
        // As many waiting as the job allows: the backlog declines the fire.
        assert_eq!(decide(Queue, 1, 1, 3, 3), D::Backlog);
        assert_eq!(decide(Allow, 2, 2, 2, 3), D::Queue);
        assert_eq!(
            decide(Allow, 2, 1, 9, 3),
            D::Start,
            "a free slot starts at once"
        );
        assert_eq!(
            decide(Forbid, 1, 1, 9, 3),
            D::Skip,
            "the overlap policy first"
        );
    }

    /// Fires one after another under `buffer_one`, with the runs they make
    /// starting and ending as the policy says: at most one running and one
    /// waiting, every other fire skipped.
    #[test]
    fn buffer_one_keeps_one_running_and_one_waiting() {
        let spec: crate::JobSpec = serde_json::from_value(serde_json::json!({
            "name": "j", "concurrency": "buffer_one", "max_active_runs": 4,
            "tasks": [{ "id": "a", "noop": true }]
        }))
        .unwrap();
        assert_eq!(spec.max_active(), 1, "always one at a time");
        let (mut active, mut waiting) = (0u32, 0u32);
        let mut fire = || {
            let d = decide(spec.concurrency, spec.max_active(), active, waiting, 100);
            match d {
                FireDecision::Start => active += 1,
                FireDecision::Queue => waiting += 1,
                _ => {}
            }
            d
        };
        use FireDecision as D;
        assert_eq!(
            [fire(), fire(), fire(), fire()],
            [D::Start, D::Queue, D::Skip, D::Skip]
        );
        // The running one ends: the waiting one starts, the next fire waits.
        (active, waiting) = (1, 0);
        assert_eq!(
            decide(spec.concurrency, spec.max_active(), active, waiting, 100),
            D::Queue
        );
    }

    #[test]
    fn each_policy_decides_a_fire_as_documented() {
        let forbid = policy(Concurrency::Forbid, 1, 100);
        assert_eq!(
            on_fire(&forbid, runs(0, 0), false, || true),
            Fire::Make(FireDecision::Start)
        );
        assert_eq!(
            on_fire(&forbid, runs(1, 0), false, || true),
            Fire::Skip(FireOutcome::SkippedOverlap)
        );
        let replace = policy(Concurrency::Replace, 1, 100);
        assert_eq!(
            on_fire(&replace, runs(1, 0), false, || true),
            Fire::Make(FireDecision::Replace)
        );
        let buffer = policy(Concurrency::BufferOne, 1, 100);
        assert_eq!(
            on_fire(&buffer, runs(1, 0), false, || true),
            Fire::Make(FireDecision::Queue)
        );
        assert_eq!(
            on_fire(&buffer, runs(1, 1), false, || true),
            Fire::Skip(FireOutcome::SkippedOverlap)
        );
        let allow = policy(Concurrency::Allow, 2, 3);
        assert_eq!(
            on_fire(&allow, runs(1, 0), false, || true),
            Fire::Make(FireDecision::Start)
        );
        assert_eq!(
            on_fire(&allow, runs(2, 2), false, || true),
            Fire::Make(FireDecision::Queue)
        );
        assert_eq!(
            on_fire(&allow, runs(2, 3), false, || true),
            Fire::Skip(FireOutcome::SkippedBacklog)
        );
        assert_eq!(
            on_fire(&allow, runs(0, 0), false, || false),
            Fire::Skip(FireOutcome::SkippedQuota)
        );
        assert_eq!(
            on_fire(&allow, runs(0, 0), true, || panic!("no quota asked")),
            Fire::Skip(FireOutcome::SkippedBreaker),
            "an open breaker first"
        );
    }

    #[test]
    fn a_planned_run_missed_is_skipped_only_under_misfire_skip() {
        let mut p = policy(Concurrency::Allow, 16, 100);
        assert_eq!(
            on_planned_due(&p, runs(0, 0), true),
            Fire::Make(FireDecision::Start)
        );
        p.misfire = Misfire::Skip;
        assert_eq!(
            on_planned_due(&p, runs(0, 0), true),
            Fire::Skip(FireOutcome::MissedSkipped)
        );
        assert_eq!(
            on_planned_due(&p, runs(0, 0), false),
            Fire::Make(FireDecision::Start)
        );
    }

    #[test]
    fn a_trigger_is_admitted_or_refused_whole() {
        let queue = policy(Concurrency::Queue, 1, 2);
        assert_eq!(
            on_trigger(&queue, runs(0, 0), 3),
            Ok(vec![
                FireDecision::Start,
                FireDecision::Queue,
                FireDecision::Queue
            ])
        );
        assert_eq!(
            on_trigger(&queue, runs(0, 0), 4),
            Err(Refusal::Backlog {
                waiting: 2,
                ahead: 3
            })
        );
        let forbid = policy(Concurrency::Forbid, 1, 100);
        assert_eq!(
            on_trigger(&forbid, runs(0, 0), 2),
            Err(Refusal::Overlap { ahead: 1 })
        );
        let replace = policy(Concurrency::Replace, 1, 100);
        assert_eq!(
            on_trigger(&replace, runs(1, 0), 2),
            Err(Refusal::ReplaceMany)
        );
    }

    #[derive(Clone, Debug)]
    enum Step {
        /// A scheduled fire, within its quota or not, its breaker open or not.
        Fire(bool, bool),
        /// A trigger asking for this many runs.
        Trigger(usize),
        /// A planned run's instant, missed or not.
        Planned(bool),
        /// The oldest active run ends.
        End,
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        proptest::collection::vec(
            prop_oneof![
                (any::<bool>(), any::<bool>()).prop_map(|(q, b)| Step::Fire(q, b)),
                (1usize..5).prop_map(Step::Trigger),
                any::<bool>().prop_map(Step::Planned),
                Just(Step::End),
            ],
            0..200,
        )
    }

    fn policies() -> impl Strategy<Value = JobPolicy> {
        (
            prop_oneof![
                Just(Concurrency::Allow),
                Just(Concurrency::Queue),
                Just(Concurrency::Forbid),
                Just(Concurrency::Replace),
                Just(Concurrency::BufferOne),
            ],
            1u32..5,
            0u32..5,
            prop_oneof![
                Just(Misfire::Skip),
                Just(Misfire::RunOnce),
                Just(Misfire::RunAll)
            ],
        )
            .prop_map(|(concurrency, max_active, max_pending, misfire)| {
                let max_active = match concurrency {
                    Concurrency::Allow | Concurrency::Queue => max_active,
                    _ => 1,
                };
                JobPolicy {
                    concurrency,
                    max_active,
                    max_pending,
                    misfire,
                }
            })
    }

    proptest! {
        /// Random events over random policies, carried out as the engine
        /// does (a replaced run ends before its replacement starts; a
        /// slot that frees starts the waiting runs it can): never more
        /// runs active than the policy allows, never more waiting than
        /// the backlog allows, one waiting at most under `buffer_one`; a
        /// fire makes a run or says why not; a run is declined only when
        /// the policy gives a reason to.
        #[test]
        fn random_events_never_break_the_job_invariants(policy in policies(), steps in steps()) {
            let mut r = JobRuns::default();
            // Carries out a decision that makes a run.
            let make = |r: &mut JobRuns, decision: FireDecision| match decision {
                FireDecision::Start => r.running += 1,
                FireDecision::Queue => r.waiting += 1,
                FireDecision::Replace => {
                    // The runs replaced end; the new run then starts.
                    r.running = 0;
                    r.waiting += 1;
                    while may_start(policy.max_active, *r) {
                        r.waiting -= 1;
                        r.running += 1;
                    }
                }
                FireDecision::Skip | FireDecision::Backlog => unreachable!("makes no run"),
            };
            for step in steps {
                let before = r;
                match step {
                    Step::Fire(within_quota, open) => match on_fire(&policy, r, open, || within_quota) {
                        Fire::Make(d) => {
                            prop_assert!(!open, "a run made while the breaker is open");
                            make(&mut r, d)
                        }
                        Fire::Skip(FireOutcome::SkippedBreaker) => prop_assert!(open),
                        Fire::Skip(FireOutcome::SkippedQuota) => prop_assert!(!within_quota && !open),
                        Fire::Skip(FireOutcome::SkippedOverlap) => prop_assert!(
                            matches!(policy.concurrency, Concurrency::Forbid | Concurrency::BufferOne)
                        ),
                        Fire::Skip(FireOutcome::SkippedBacklog) => {
                            prop_assert!(r.waiting >= policy.max_pending)
                        }
                        Fire::Skip(other) => prop_assert!(false, "a fire skipped as {other:?}"),
                    },
                    Step::Planned(missed) => match on_planned_due(&policy, r, missed) {
                        Fire::Make(d) => make(&mut r, d),
                        Fire::Skip(FireOutcome::MissedSkipped) => {
                            prop_assert!(missed && policy.misfire == Misfire::Skip)
                        }
                        Fire::Skip(_) => {}
                    },
                    Step::Trigger(n) => {
                        if let Ok(decisions) = on_trigger(&policy, r, n) {
                            prop_assert_eq!(decisions.len(), n);
                            for d in decisions {
                                make(&mut r, d);
                            }
                        } else {
                            prop_assert_eq!(r, before, "a refused trigger changes nothing");
                        }
                    }
                    Step::End => {
                        r.running = r.running.saturating_sub(1);
                        while may_start(policy.max_active, r) {
                            r.waiting -= 1;
                            r.running += 1;
                        }
                    }
                }
                prop_assert!(r.running <= policy.max_active, "{r:?} under {policy:?}");
                prop_assert!(
                    r.waiting <= policy.max_pending.max(before.waiting),
                    "{r:?} under {policy:?}"
                );
                if policy.concurrency == Concurrency::BufferOne {
                    prop_assert!(r.waiting <= 1, "{r:?}");
                }
                if matches!(policy.concurrency, Concurrency::Allow | Concurrency::Queue)
                    && r.running < policy.max_active
                {
                    prop_assert_eq!(r.waiting, 0, "a run waits beside a free slot");
                }
            }
        }
    }
}
