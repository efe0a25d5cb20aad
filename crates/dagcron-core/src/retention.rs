//! Retention: which finished runs (with their tasks, attempts and logs),
//! which rows of the fire ledger and which deleted jobs' histories go, by
//! age and count, under a namespace's policy. The store reads the facts,
//! the pruner asks here and deletes what these functions name; the instant
//! is an argument.
//!
//! What is never pruned, whatever the policy:
//! - an unfinished run (`pending` or `running`);
//! - one of the `keep_last` newest runs of a job that exists, or one of the
//!   `keep_last` newest rows of its ledger;
//! - a run that a stored re-run re-runs (it goes once the re-run has gone);
//! - the newest row of a job's ledger, nor the run it made: recovery and a
//!   new owner in a cluster resume a job from its newest fire, so pruning
//!   can never make a fire happen twice;
//! - a ledger row whose run is still stored (it goes with its run).

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::RunState;

/// The shortest age a policy may keep history for: far longer than any
/// lease, so that a tombstone outlives every node that has not read it.
pub const MIN_AGE_SECONDS: u64 = 3600;

/// The longest age a policy may name (100 years).
pub const MAX_AGE_SECONDS: u64 = 100 * 366 * 86_400;

/// The most runs per job a policy may keep.
pub const MAX_KEEP_LAST: u32 = 1_000_000;

/// A namespace's retention policy: history is kept for `max_age_seconds`
/// and, for each job that exists, at least the `keep_last` newest runs
/// (and ledger rows) whatever their age.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// How long history is kept, in seconds (from a run's end, from a
    /// fire's scheduled instant, from a job's deletion).
    pub max_age_seconds: u64,
    /// How many of a job's newest runs are kept, however old.
    pub keep_last: u32,
}

impl Default for Retention {
    /// 30 days and the last 100 runs of each job: a month covers the
    /// questions asked after an incident and a monthly job's last fires;
    /// 100 runs keep a rarely firing job's history readable for years.
    fn default() -> Retention {
        Retention {
            max_age_seconds: 30 * 86_400,
            keep_last: 100,
        }
    }
}

/// What the pruner knows of one run of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunFacts {
    /// The run.
    pub id: i64,
    /// Its state.
    pub state: RunState,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it ended, if it has.
    pub finished_at: Option<Timestamp>,
    /// A stored run re-runs it.
    pub rerun: bool,
    /// How many attempts it has (counted, not decided on).
    pub attempts: u64,
    /// Its fire's ledger row names it (that row goes with it).
    pub fired: bool,
}

/// What the pruner knows of one row of a job's fire ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FireFacts {
    /// The fire's scheduled instant (the row's key within its job).
    pub scheduled_at: Timestamp,
    /// The run it made is still stored.
    pub run_stored: bool,
}

/// What the pruner knows of a job as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobFacts {
    /// When it was deleted (`None`: it exists).
    pub deleted_at: Option<Timestamp>,
    /// Its newest ledger row: the instant, and the run it made.
    pub newest_fire: Option<(Timestamp, Option<i64>)>,
}

impl JobFacts {
    fn live(&self) -> bool {
        self.deleted_at.is_none()
    }
}

impl Retention {
    /// History older than this instant may go.
    pub fn cutoff(&self, now: Timestamp) -> Timestamp {
        let age =
            SignedDuration::from_secs(i64::try_from(self.max_age_seconds).unwrap_or(i64::MAX));
        now.checked_sub(age).unwrap_or(Timestamp::MIN)
    }

    /// How many of the newest runs (and ledger rows) of `job` are kept
    /// whatever their age, so that the store need not read them: a
    /// deleted job's history goes by age alone.
    pub fn keep(&self, job: &JobFacts) -> u32 {
        if job.live() { self.keep_last } else { 0 }
    }

    /// Which of `runs` go. `runs` are runs of `job`, oldest first, and at
    /// least `newer` runs of the job are newer than the newest of them.
    pub fn runs_to_prune(
        &self,
        now: Timestamp,
        job: &JobFacts,
        newer: u64,
        runs: &[RunFacts],
    ) -> Vec<i64> {
        let newest_fire_run = job.newest_fire.and_then(|(_, run)| run);
        self.may_go(now, job, newer, runs)
            .filter(|id| Some(*id) != newest_fire_run)
            .collect()
    }

    /// The run of a deleted job's newest fire, if it is among `runs` and
    /// would go but for being that: it goes when the job is forgotten, in
    /// the same transaction as the rest of the job's ledger, so that the
    /// newest fire is never missing while the job's versions are stored
    /// (a job applied again resumes from it).
    pub fn held_for_forget(
        &self,
        now: Timestamp,
        job: &JobFacts,
        newer: u64,
        runs: &[RunFacts],
    ) -> Option<i64> {
        let newest_fire_run = job.newest_fire.and_then(|(_, run)| run)?;
        if job.live() {
            return None;
        }
        self.may_go(now, job, newer, runs)
            .find(|id| *id == newest_fire_run)
    }

    /// The runs that may go by state, age, count and re-runs.
    fn may_go<'a>(
        &self,
        now: Timestamp,
        job: &JobFacts,
        newer: u64,
        runs: &'a [RunFacts],
    ) -> impl Iterator<Item = i64> + 'a {
        let cutoff = self.cutoff(now);
        let keep = u64::from(self.keep(job));
        let count = runs.len() as u64;
        runs.iter()
            .enumerate()
            .filter(move |(i, r)| {
                // How many runs of the job are newer than this one.
                let rank = newer + (count - 1 - *i as u64);
                let ended_at = r.finished_at.unwrap_or(r.created_at);
                r.state.is_terminal() && rank >= keep && ended_at < cutoff && !r.rerun
            })
            .map(|(_, r)| r.id)
    }

    /// Whether a job's runs after `runs` (the oldest first) may hold more
    /// to prune: run ids follow creation, so once a run was created after
    /// the cutoff, the runs after it were too.
    pub fn more_after(&self, now: Timestamp, runs: &[RunFacts]) -> bool {
        runs.last().is_some_and(|r| r.created_at < self.cutoff(now))
    }

    /// Which of `fires` (ledger rows of `job`, oldest first, with at least
    /// `newer` rows of the job newer than the newest of them) go.
    pub fn fires_to_prune(
        &self,
        now: Timestamp,
        job: &JobFacts,
        newer: u64,
        fires: &[FireFacts],
    ) -> Vec<Timestamp> {
        let cutoff = self.cutoff(now);
        let keep = u64::from(self.keep(job));
        let newest = job.newest_fire.map(|(at, _)| at);
        let count = fires.len() as u64;
        fires
            .iter()
            .enumerate()
            .filter(|(i, f)| {
                let rank = newer + (count - 1 - *i as u64);
                !f.run_stored
                    && rank >= keep
                    && f.scheduled_at < cutoff
                    && Some(f.scheduled_at) != newest
            })
            .map(|(_, f)| f.scheduled_at)
            .collect()
    }

    /// Whether a deleted job is forgotten: its versions, its tombstone and
    /// what is left of its ledger go, once it has been deleted for the
    /// policy's age and none of its runs is stored. A job applied again
    /// after that starts over at version 1, like a new one.
    pub fn forget(&self, now: Timestamp, job: &JobFacts, runs_left: bool) -> bool {
        job.deleted_at.is_some_and(|at| at < self.cutoff(now)) && !runs_left
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const DAY: i64 = 86_400;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn run(id: i64, state: RunState, ended: i64) -> RunFacts {
        RunFacts {
            id,
            state,
            created_at: at(ended - 10),
            finished_at: state.is_terminal().then(|| at(ended)),
            rerun: false,
            attempts: 1,
            fired: true,
        }
    }

    const LIVE: JobFacts = JobFacts {
        deleted_at: None,
        newest_fire: None,
    };

    fn policy(days: u64, keep_last: u32) -> Retention {
        Retention {
            max_age_seconds: days * 86_400,
            keep_last,
        }
    }

    #[test]
    fn old_finished_runs_beyond_the_newest_go() {
        let now = at(100 * DAY);
        let p = policy(30, 2);
        let runs = [
            run(1, RunState::Succeeded, 10 * DAY),
            run(2, RunState::Failed, 20 * DAY),
            run(3, RunState::Running, 21 * DAY),
            run(4, RunState::Succeeded, 80 * DAY),
        ];
        // Two newer runs exist beyond these: only age and state decide.
        assert_eq!(p.runs_to_prune(now, &LIVE, 2, &runs), vec![1, 2]);
        // With no newer run, the newest two of these are kept.
        assert_eq!(p.runs_to_prune(now, &LIVE, 0, &runs), vec![1, 2]);
        assert_eq!(
            p.runs_to_prune(now, &LIVE, 0, &runs[..2]),
            Vec::<i64>::new()
        );
        assert_eq!(p.runs_to_prune(now, &LIVE, 1, &runs[..2]), vec![1]);
    }

    #[test]
    fn a_rerun_s_original_and_the_newest_fire_s_run_stay() {
        let now = at(100 * DAY);
        let p = policy(30, 0);
        let mut runs = [
            run(1, RunState::Failed, DAY),
            run(2, RunState::Succeeded, DAY),
        ];
        runs[0].rerun = true;
        let job = JobFacts {
            deleted_at: None,
            newest_fire: Some((at(DAY), Some(2))),
        };
        assert_eq!(p.runs_to_prune(now, &job, 5, &runs), Vec::<i64>::new());
    }

    #[test]
    fn a_deleted_job_goes_by_age_alone_then_is_forgotten() {
        let now = at(100 * DAY);
        let p = policy(30, 100);
        let deleted = JobFacts {
            deleted_at: Some(at(50 * DAY)),
            newest_fire: Some((at(40 * DAY), None)),
        };
        assert_eq!(p.keep(&deleted), 0);
        let runs = [
            run(1, RunState::Succeeded, 40 * DAY),
            run(2, RunState::Succeeded, 41 * DAY),
        ];
        assert_eq!(p.runs_to_prune(now, &deleted, 0, &runs), vec![1, 2]);
        assert_eq!(p.held_for_forget(now, &deleted, 0, &runs), None);
        // The newest fire's run waits for the job to be forgotten.
        let fired = JobFacts {
            newest_fire: Some((at(41 * DAY), Some(2))),
            ..deleted
        };
        assert_eq!(p.runs_to_prune(now, &fired, 0, &runs), vec![1]);
        assert_eq!(p.held_for_forget(now, &fired, 0, &runs), Some(2));
        let live = JobFacts {
            deleted_at: None,
            ..fired
        };
        assert_eq!(p.held_for_forget(now, &live, 5, &runs), None);
        assert!(p.forget(now, &deleted, false));
        assert!(!p.forget(now, &deleted, true), "its runs go first");
        let recent = JobFacts {
            deleted_at: Some(at(90 * DAY)),
            ..deleted
        };
        assert!(!p.forget(now, &recent, false));
        assert!(!p.forget(now, &LIVE, false), "a job that exists stays");
    }

    #[test]
    fn ledger_rows_go_without_their_run_and_never_the_newest() {
        let now = at(100 * DAY);
        let p = policy(30, 1);
        let fires = [
            FireFacts {
                scheduled_at: at(DAY),
                run_stored: false,
            },
            FireFacts {
                scheduled_at: at(2 * DAY),
                run_stored: true,
            },
            FireFacts {
                scheduled_at: at(3 * DAY),
                run_stored: false,
            },
        ];
        let job = JobFacts {
            deleted_at: None,
            newest_fire: Some((at(3 * DAY), None)),
        };
        assert_eq!(p.fires_to_prune(now, &job, 0, &fires), vec![at(DAY)]);
        // Even with nothing kept by count, the newest row stays.
        assert_eq!(
            policy(30, 0).fires_to_prune(now, &job, 0, &fires),
            vec![at(DAY)]
        );
    }

    #[test]
    fn the_walk_stops_at_the_first_run_made_after_the_cutoff() {
        let now = at(100 * DAY);
        let p = policy(30, 0);
        assert!(p.more_after(now, &[run(1, RunState::Succeeded, DAY)]));
        assert!(!p.more_after(now, &[run(1, RunState::Succeeded, 99 * DAY)]));
        assert!(!p.more_after(now, &[]));
    }

    #[test]
    fn the_default_and_its_stored_form() {
        let d = Retention::default();
        assert_eq!((d.max_age_seconds, d.keep_last), (2_592_000, 100));
        let text = serde_json::to_string(&d).unwrap();
        assert_eq!(text, r#"{"max_age_seconds":2592000,"keep_last":100}"#);
        assert_eq!(serde_json::from_str::<Retention>(&text).unwrap(), d);
    }

    fn any_run() -> impl Strategy<Value = (u8, i64, bool, bool)> {
        (0u8..6, 0i64..200, any::<bool>(), any::<bool>())
    }

    proptest! {
        /// Whatever the runs, nothing pruned is unfinished, young, among
        /// the newest kept, re-run by another, or the newest fire's run.
        #[test]
        fn nothing_protected_is_ever_pruned(
            raw in prop::collection::vec(any_run(), 0..40),
            newer in 0u64..5,
            days in 1u64..100,
            keep_last in 0u32..10,
            deleted in any::<bool>(),
            newest_pick in any::<prop::sample::Index>(),
        ) {
            let now = at(200 * DAY);
            let p = policy(days, keep_last);
            let runs: Vec<RunFacts> = raw.iter().enumerate().map(|(i, (s, day, rerun, open))| {
                let state = if *open { RunState::ALL[*s as usize % 2] } else { RunState::ALL[*s as usize % RunState::ALL.len()] };
                RunFacts { rerun: *rerun, ..run(i as i64, state, day * DAY) }
            }).collect();
            let newest = (!runs.is_empty()).then(|| runs[newest_pick.index(runs.len())].id);
            let job = JobFacts {
                deleted_at: deleted.then(|| at(DAY)),
                newest_fire: Some((at(0), newest)),
            };
            let pruned = p.runs_to_prune(now, &job, newer, &runs);
            let keep = if deleted { 0 } else { u64::from(keep_last) };
            for id in &pruned {
                let i = runs.iter().position(|r| r.id == *id).unwrap();
                let r = runs[i];
                prop_assert!(r.state.is_terminal());
                prop_assert!(r.finished_at.unwrap() < p.cutoff(now));
                prop_assert!(!r.rerun);
                prop_assert!(Some(r.id) != newest);
                prop_assert!(newer + (runs.len() - 1 - i) as u64 >= keep);
            }
            // And everything that is none of these goes.
            let expected = runs.iter().enumerate().filter(|(i, r)| {
                r.state.is_terminal() && r.finished_at.unwrap() < p.cutoff(now) && !r.rerun
                    && Some(r.id) != newest && newer + (runs.len() - 1 - i) as u64 >= keep
            }).count();
            prop_assert_eq!(pruned.len(), expected);
        }

        /// No ledger row whose run is stored, young, among the newest kept
        /// or the newest of all is pruned.
        #[test]
        fn no_protected_ledger_row_is_pruned(
            raw in prop::collection::vec((0i64..200, any::<bool>()), 0..40),
            newer in 0u64..5,
            keep_last in 0u32..10,
        ) {
            let now = at(200 * DAY);
            let p = policy(30, keep_last);
            let mut days: Vec<i64> = raw.iter().map(|(d, _)| *d).collect();
            days.sort();
            days.dedup();
            let fires: Vec<FireFacts> = days.iter().zip(&raw).map(|(d, (_, stored))| FireFacts {
                scheduled_at: at(d * DAY), run_stored: *stored,
            }).collect();
            let newest = fires.last().map(|f| f.scheduled_at);
            let job = JobFacts { deleted_at: None, newest_fire: newest.map(|t| (t, None)) };
            let pruned = p.fires_to_prune(now, &job, newer, &fires);
            for t in &pruned {
                let i = fires.iter().position(|f| f.scheduled_at == *t).unwrap();
                prop_assert!(!fires[i].run_stored);
                prop_assert!(*t < p.cutoff(now));
                prop_assert!(Some(*t) != newest);
                prop_assert!(newer + (fires.len() - 1 - i) as u64 >= u64::from(keep_last));
            }
        }
    }
}
