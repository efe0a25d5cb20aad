//! The batches being committed.
//!
//! A store that commits batches side by side (PostgreSQL: each on a
//! connection of its own) is given up to [`RunStore::write_lanes`] of them at
//! once, on one condition: a batch is sent beside the ones in flight only if
//! it touches none of their runs and none of their jobs' fire ledgers. Rows
//! that one batch changes are so never written by another in flight, and a
//! job's fires are committed in the order they were decided (start-up
//! resumes each job from its latest fire). Whatever order the commits end
//! in, the batches' effects (attempts started, callers answered) are carried
//! out in the order the batches were made: an answer never runs ahead of a
//! batch decided before it.

use std::collections::{HashSet, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::task::{Context, Poll};

use dagcron_store::{StorageError, Write, WriteResult};

use super::{Action, Commit};

/// The engine's batch part: what is decided and not yet committed, and
/// what to do once it is.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) writes: Vec<Write>,
    pub(super) effects: Vec<Action>,
}

/// What a committed batch hands back: its writes, their results and the
/// effects to carry out now.
pub(super) type Committed = (Arc<Vec<Write>>, Results, Vec<Action>);

/// A batch's results, once its commit has ended.
type Results = Result<Vec<WriteResult>, StorageError>;

/// What a batch touches: its runs' ids and hashes of the jobs of its
/// fires and breakers. Two
/// batches whose keys meet are not committed side by side (a collision
/// only makes a batch wait for its turn).
#[derive(Default)]
pub(super) struct Keys(HashSet<u64, foldhash::fast::FixedState>);

impl Keys {
    fn of(writes: &[Write]) -> Keys {
        let mut keys = Keys::default();
        let jobs = foldhash::fast::FixedState::with_seed(0x6a6f6273);
        for w in writes {
            match w {
                Write::Fire { namespace, job, .. }
                | Write::Breaker(dagcron_store::BreakerWrite { namespace, job, .. }) => {
                    keys.0.insert(jobs.hash_one((namespace, job)));
                }
                _ => {}
            }
            if let Some(id) = w.run_id() {
                keys.0.insert(id as u64);
            }
        }
        keys
    }

    fn meets(&self, other: &Keys) -> bool {
        let (small, large) = if self.0.len() <= other.0.len() {
            (self, other)
        } else {
            (other, self)
        };
        small.0.iter().any(|k| large.0.contains(k))
    }
}

/// One batch in flight.
struct InFlight {
    commit: Option<Commit>,
    done: Option<(Arc<Vec<Write>>, Results)>,
    effects: Vec<Action>,
    keys: Keys,
}

/// The batches in flight, oldest first.
pub(super) struct Commits {
    queue: VecDeque<InFlight>,
    lanes: usize,
    /// The batch being made meets one in flight: it waits until one ends
    /// (it only grows meanwhile, so it would meet it still).
    blocked: bool,
}

impl Commits {
    pub(super) fn new(lanes: usize) -> Commits {
        Commits {
            queue: VecDeque::new(),
            lanes: lanes.max(1),
            blocked: false,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether a batch of `writes` may be sent now; if so, what it
    /// touches, to send with it.
    pub(super) fn may_send(&mut self, writes: &[Write]) -> Option<Keys> {
        if self.queue.is_empty() {
            return Some(if self.lanes > 1 {
                Keys::of(writes)
            } else {
                Keys::default()
            });
        }
        if self.queue.len() >= self.lanes || self.blocked {
            return None;
        }
        let keys = Keys::of(writes);
        if self.queue.iter().any(|f| f.keys.meets(&keys)) {
            self.blocked = true;
            return None;
        }
        Some(keys)
    }

    pub(super) fn send(&mut self, commit: Commit, effects: Vec<Action>, keys: Keys) {
        self.queue.push_back(InFlight {
            commit: Some(commit),
            done: None,
            effects,
            keys,
        });
    }

    /// Drives every commit in flight; ready with the oldest batch once it
    /// is committed.
    pub(super) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Committed> {
        for f in &mut self.queue {
            if let Some(commit) = &mut f.commit {
                if let Poll::Ready(done) = commit.as_mut().poll(cx) {
                    f.commit = None;
                    f.done = Some(done);
                }
            }
        }
        if self.queue.front().is_some_and(|f| f.done.is_some()) {
            let f = self.queue.pop_front().expect("checked");
            self.blocked = false;
            let (writes, results) = f.done.expect("checked");
            return Poll::Ready((writes, results, f.effects));
        }
        Poll::Pending
    }

    /// The oldest batch, once committed.
    pub(super) async fn next(&mut self) -> Committed {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dagcron_core::{FireOutcome, TaskState};

    fn task(run: i64) -> Write {
        Write::TaskState {
            run,
            task: "t".into(),
            from: TaskState::Ready,
            to: TaskState::Running,
        }
    }

    fn fire(job: &str, at: i64) -> Write {
        Write::Fire {
            namespace: "n".into(),
            job: job.into(),
            scheduled_at: jiff::Timestamp::from_second(at).unwrap(),
            outcome: FireOutcome::SkippedOverlap,
            calendar: None,
            run: None,
        }
    }

    fn ready(n: usize) -> Commit {
        Box::pin(async move { (Arc::new(Vec::new()), Ok(vec![WriteResult::Done; n])) })
    }

    #[test]
    fn batches_that_share_a_run_or_a_job_are_not_sent_side_by_side() {
        let mut c = Commits::new(2);
        let keys = c
            .may_send(&[task(1), fire("a", 10)])
            .expect("nothing in flight");
        c.send(ready(0), vec![], keys);
        // Another run and another job's fires: beside it.
        assert!(c.may_send(&[task(2), fire("b", 10)]).is_some());
        // The same run, or the same job at another instant: after it.
        assert!(c.may_send(&[task(2), task(1)]).is_none());
        // Once blocked, the growing batch waits for a commit to end.
        assert!(c.may_send(&[task(3)]).is_none());
        let mut c = Commits::new(2);
        let keys = c.may_send(&[fire("a", 10)]).unwrap();
        c.send(ready(0), vec![], keys);
        assert!(c.may_send(&[fire("a", 11)]).is_none());
        // A store of one lane never sends a second batch.
        let mut c = Commits::new(1);
        let keys = c.may_send(&[task(1)]).unwrap();
        c.send(ready(0), vec![], keys);
        assert!(c.may_send(&[task(2)]).is_none());
    }

    #[tokio::test]
    async fn effects_come_in_the_order_the_batches_were_made() {
        let mut c = Commits::new(2);
        let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
        let first: Commit = Box::pin(async move {
            first_rx.await.unwrap();
            (Arc::new(vec![task(1)]), Ok(vec![WriteResult::Done]))
        });
        let k = c.may_send(&[task(1)]).unwrap();
        c.send(first, vec![], k);
        let k = c.may_send(&[task(2)]).unwrap();
        c.send(ready(2), vec![], k);
        // The second is committed, the first not yet: nothing comes out.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(c.poll_next(&mut cx).is_pending());
        first_tx.send(()).unwrap();
        let (writes, results, _) = c.next().await;
        assert_eq!(*writes, vec![task(1)]);
        assert_eq!(results.unwrap().len(), 1);
        let (_, results, _) = c.next().await;
        assert_eq!(results.unwrap().len(), 2);
        assert!(c.is_empty());
    }
}
