//! Priorities: which ready attempt starts first when there are more than
//! slots.
//!
//! A job (or one of its tasks) has a `priority` from [`MIN`] to [`MAX`]
//! (default [`DEFAULT`]); higher starts first. Waiting ages an attempt: its
//! *rank* is the instant it became ready less [`AGING`] per level, so an
//! attempt that has waited `AGING` x (difference of levels) longer than a
//! higher one goes before it, and no priority waits forever behind a
//! stream of higher ones.
//!
//! Priorities order a namespace's own work: the pool and the agents' queue
//! still take namespaces in turn (by weight), so a tenant cannot take the
//! slots of others by raising its priorities. Within a namespace,
//! [`Levels`] chooses which level serves next, the one whose
//! longest-waiting attempt has the smallest rank; a level keeps its own
//! order (first in, first out; jobs in turn on the agents' queue). With one
//! level (every job at the default) nothing changes. The cluster's shared
//! queue (the work a node with a full pool hands to the others) has no
//! turns: it is ordered by rank.

use std::collections::BTreeMap;

/// The lowest priority.
pub const MIN: i32 = -100;
/// The highest priority.
pub const MAX: i32 = 100;
/// A job's priority when it names none.
pub const DEFAULT: i32 = 0;
/// How long a waiting attempt takes to climb one level, in microseconds
/// (10 s: from the lowest level to the highest in about 33 minutes).
pub const AGING_US: i64 = 10_000_000;

/// The order key of an attempt ready at `ready_us` (microseconds): smaller
/// starts first.
pub fn rank(ready_us: i64, priority: i32) -> i64 {
    ready_us.saturating_sub(i64::from(priority).saturating_mul(AGING_US))
}

/// A queue per priority level; see the module documentation.
#[derive(Debug)]
pub struct Levels<Q> {
    /// Highest priority first.
    levels: Vec<Level<Q>>,
}

#[derive(Debug)]
struct Level<Q> {
    priority: i32,
    queue: Q,
    /// When the level's items became ready (microseconds), with how many
    /// became ready then: the first is the longest-waiting.
    ready: BTreeMap<i64, u32>,
}

impl<Q> Default for Levels<Q> {
    fn default() -> Levels<Q> {
        Levels { levels: Vec::new() }
    }
}

impl<Q: Default> Levels<Q> {
    /// The queue of `priority`, for an item ready at `ready_us` that the
    /// caller puts in it.
    pub fn push(&mut self, priority: i32, ready_us: i64) -> &mut Q {
        let i = match self.levels.binary_search_by(|l| priority.cmp(&l.priority)) {
            Ok(i) => i,
            Err(i) => {
                self.levels.insert(
                    i,
                    Level {
                        priority,
                        queue: Q::default(),
                        ready: BTreeMap::new(),
                    },
                );
                i
            }
        };
        let level = &mut self.levels[i];
        *level.ready.entry(ready_us).or_default() += 1;
        &mut level.queue
    }
}

impl<Q> Levels<Q> {
    /// Whether no level holds an item.
    pub fn is_empty(&self) -> bool {
        self.levels.is_empty()
    }

    /// The levels in the order they are offered the next slot: by the rank
    /// of their longest-waiting item, the higher level first on a tie.
    pub fn order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.levels.len()).collect();
        if order.len() > 1 {
            order.sort_by_key(|&i| {
                let l = &self.levels[i];
                let oldest = l.ready.keys().next().copied().unwrap_or(i64::MAX);
                (rank(oldest, l.priority), i)
            });
        }
        order
    }

    /// The queue of level `i` (an index from [`Levels::order`]).
    pub fn queue(&mut self, i: usize) -> &mut Q {
        &mut self.levels[i].queue
    }

    /// An item ready at `ready_us` left level `i`; an empty level goes.
    pub fn took(&mut self, i: usize, ready_us: i64) {
        let level = &mut self.levels[i];
        debug_assert!(
            level.ready.contains_key(&ready_us),
            "an item leaves with the instant it came with"
        );
        if let Some(n) = level.ready.get_mut(&ready_us) {
            *n -= 1;
            if *n == 0 {
                level.ready.remove(&ready_us);
            }
        }
        if level.ready.is_empty() {
            self.levels.remove(i);
        }
    }

    /// Takes the first item that `take` finds in a level's queue, trying
    /// the levels in [`Levels::order`]; `ready` tells when an item became
    /// ready.
    pub fn take<T>(
        &mut self,
        mut take: impl FnMut(&mut Q) -> Option<T>,
        ready: impl Fn(&T) -> i64,
    ) -> Option<T> {
        // The usual case, one level: no order to work out.
        if self.levels.len() == 1 {
            let item = take(&mut self.levels[0].queue)?;
            self.took(0, ready(&item));
            return Some(item);
        }
        for i in self.order() {
            if let Some(item) = take(&mut self.levels[i].queue) {
                self.took(i, ready(&item));
                return Some(item);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;

    type Q = Levels<VecDeque<(i32, i64, u32)>>;

    fn push(q: &mut Q, priority: i32, ready: i64, id: u32) {
        q.push(priority, ready).push_back((priority, ready, id));
    }

    fn pop(q: &mut Q) -> Option<u32> {
        q.take(VecDeque::pop_front, |i| i.1).map(|i| i.2)
    }

    #[test]
    fn higher_first_first_in_first_out_within_a_level() {
        let mut q = Q::default();
        push(&mut q, 0, 0, 1);
        push(&mut q, 0, 1, 2);
        push(&mut q, 50, 2, 3);
        push(&mut q, -5, 3, 4);
        push(&mut q, 50, 4, 5);
        let order: Vec<u32> = std::iter::from_fn(|| pop(&mut q)).collect();
        assert_eq!(order, [3, 5, 1, 2, 4]);
        assert!(q.levels.is_empty(), "empty levels go");
    }

    #[test]
    fn waiting_long_enough_beats_a_higher_level() {
        let mut q = Q::default();
        // Priority 0, ready at 0; priority 2 ready 25 s later: its rank is
        // 5 s (25 - 2 x 10), the waiting one's 0, so the older goes first.
        push(&mut q, 0, 0, 1);
        push(&mut q, 2, 25 * AGING_US / 10, 2);
        assert_eq!(pop(&mut q), Some(1));
        assert_eq!(pop(&mut q), Some(2));
        // Ready 15 s later, rank -5 s: the higher one goes first.
        push(&mut q, 0, 0, 3);
        push(&mut q, 2, 15 * AGING_US / 10, 4);
        assert_eq!(pop(&mut q), Some(4));
    }

    proptest! {
        /// Whatever arrives, an item waiting is passed only by items of its
        /// level that came before it, or of another level whose rank is no
        /// larger than its own: so only by the higher items that became
        /// ready within its aging window, and a stream of higher
        /// priorities cannot starve it.
        #[test]
        fn no_level_starves(arrivals in prop::collection::vec((MIN..=MAX, 0..1_000i64), 1..200)) {
            let mut q = Q::default();
            let mut now = 0;
            let mut ready = Vec::new();
            // One slot: an item arrives every step, one is taken every other.
            let mut taken: Vec<(u32, usize)> = Vec::new();
            for (id, (p, gap)) in arrivals.iter().enumerate() {
                now += gap * 1000;
                ready.push(now);
                push(&mut q, *p, now, id as u32);
                if id % 2 == 1 {
                    taken.push((pop(&mut q).unwrap(), id));
                }
            }
            let end = arrivals.len();
            taken.extend(std::iter::from_fn(|| pop(&mut q)).map(|x| (x, end)));
            prop_assert_eq!(taken.len(), arrivals.len());
            let rank_of = |id: u32| rank(ready[id as usize], arrivals[id as usize].0);
            for (k, (x, _)) in taken.iter().enumerate() {
                for (y, step) in &taken[..k] {
                    // x had arrived (its id is its arrival step) when y was taken.
                    if (*x as usize) > *step {
                        continue;
                    }
                    if arrivals[*y as usize].0 == arrivals[*x as usize].0 {
                        prop_assert!(y < x, "{} passed {} in their level", y, x);
                    } else {
                        prop_assert!(rank_of(*y) <= rank_of(*x), "{} (rank {}) passed {} (rank {})", y, rank_of(*y), x, rank_of(*x));
                    }
                }
            }
        }
    }
}
