//! The pool's ready queue: a queue per namespace, taken in turn (each
//! namespace up to its weight a turn), so that a namespace with a backlog
//! cannot keep another's next task out of the pool; within a namespace,
//! levels of priority (see `dagcron_core::priority`), first in, first out
//! within a level.

use std::collections::{HashMap, VecDeque};

use dagcron_core::priority::Levels;

/// A namespace's waiting items: how many, and by level, each ready at its
/// instant.
type Namespace<T> = (usize, Levels<VecDeque<(i64, T)>>);

/// A queue per namespace, taken in turn: while several namespaces wait,
/// the pool's slots are shared between them by weight (a namespace of
/// weight 3 takes up to three items in its turn).
pub(super) struct Shares<T> {
    queues: HashMap<String, Namespace<T>>,
    /// The namespaces with something waiting, the next one to take from first.
    turn: VecDeque<String>,
    /// Items taken from the namespace at the front in its current turn.
    taken: u32,
    len: usize,
}

impl<T> Default for Shares<T> {
    fn default() -> Shares<T> {
        Shares {
            queues: HashMap::new(),
            turn: VecDeque::new(),
            taken: 0,
            len: 0,
        }
    }
}

impl<T> Shares<T> {
    /// Queues an item of `namespace` at `priority`, ready at `ready_us`.
    pub(super) fn push_back(&mut self, namespace: &str, priority: i32, ready_us: i64, item: T) {
        let queue = match self.queues.get_mut(namespace) {
            Some(q) => q,
            None => {
                self.turn.push_back(namespace.to_string());
                self.queues.entry(namespace.to_string()).or_default()
            }
        };
        queue.0 += 1;
        queue.1.push(priority, ready_us).push_back((ready_us, item));
        self.len += 1;
    }

    /// The next item of the namespace whose turn it is (of its level served
    /// next); once it has taken `weight(namespace)` items in this turn (or
    /// has none left), the turn passes to the next namespace.
    pub(super) fn pop_front(&mut self, weight: impl Fn(&str) -> u32) -> Option<T> {
        let namespace = self.turn.front()?;
        let queue = self.queues.get_mut(namespace).expect("a queue per turn");
        let (_, item) = queue
            .1
            .take(VecDeque::pop_front, |i| i.0)
            .expect("a queue in turn is not empty");
        queue.0 -= 1;
        self.taken += 1;
        self.len -= 1;
        if queue.0 == 0 {
            let namespace = self.turn.pop_front().expect("its turn");
            self.queues.remove(&namespace);
            self.taken = 0;
        } else if self.taken >= weight(namespace).max(1) {
            let namespace = self.turn.pop_front().expect("its turn");
            self.turn.push_back(namespace);
            self.taken = 0;
        }
        Some(item)
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The items waiting of each namespace that has some.
    pub(super) fn counts(&self) -> impl Iterator<Item = (&str, usize)> {
        self.queues.iter().map(|(ns, q)| (ns.as_str(), q.0))
    }
}

#[cfg(test)]
mod tests {
    use super::Shares;

    /// A namespace with a backlog of 600 and one with a single task: the
    /// single task is taken second, not 601st; within a namespace, in order.
    #[test]
    fn a_backlog_does_not_keep_another_namespaces_task_waiting() {
        let mut q = Shares::default();
        for i in 0..600 {
            q.push_back("alpha", 0, i, ("alpha", i));
        }
        q.push_back("beta", 0, 600, ("beta", 0));
        assert_eq!(q.len(), 601);
        let counts = |q: &Shares<_>| {
            q.counts()
                .map(|(n, c)| (n.to_string(), c))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        assert_eq!(
            counts(&q),
            [("alpha".to_string(), 600), ("beta".to_string(), 1)].into()
        );
        assert_eq!(q.pop_front(|_| 1), Some(("alpha", 0)));
        assert_eq!(q.pop_front(|_| 1), Some(("beta", 0)));
        assert_eq!(
            counts(&q),
            [("alpha".to_string(), 599)].into(),
            "none of beta's left waiting"
        );
        let rest: Vec<_> = std::iter::from_fn(|| q.pop_front(|_| 1)).collect();
        assert_eq!(rest.len(), 599);
        assert!(rest.windows(2).all(|w| w[0].1 < w[1].1), "in order");
        assert_eq!(q.len(), 0);
        assert_eq!(q.counts().count(), 0);
        assert_eq!(q.pop_front(|_| 1), None);
    }

    /// Three namespaces waiting take the pool in turn.
    #[test]
    fn namespaces_take_turns() {
        let mut q = Shares::default();
        for ns in ["a", "b", "c"] {
            for i in 0..3 {
                q.push_back(ns, 0, i, (ns, i));
            }
        }
        let order: Vec<&str> = std::iter::from_fn(|| q.pop_front(|_| 1))
            .map(|(ns, _)| ns)
            .collect();
        assert_eq!(order, ["a", "b", "c", "a", "b", "c", "a", "b", "c"]);
    }

    /// By weight: `a` of weight 3 takes three slots to `b`'s one while
    /// both wait; then `b` alone takes what is left.
    #[test]
    fn namespaces_take_turns_by_weight() {
        let mut q = Shares::default();
        for i in 0..6 {
            q.push_back("a", 0, i, ("a", i));
        }
        for i in 0..4 {
            q.push_back("b", 0, i, ("b", i));
        }
        let weight = |ns: &str| if ns == "a" { 3 } else { 1 };
        let order: String = std::iter::from_fn(|| q.pop_front(weight))
            .map(|(ns, _)| ns)
            .collect();
        assert_eq!(order, "aaabaaabbb");
    }

    /// Levels within a namespace, turns between namespaces: a priority 10
    /// item goes first among `a`'s, and does not take `b`'s turn; a
    /// namespace that raises its priorities gets no more of the pool.
    #[test]
    fn a_higher_priority_goes_first_within_its_namespace_only() {
        let mut q = Shares::default();
        for i in 0..3 {
            q.push_back("a", 0, i, ("a", i));
            q.push_back("b", 0, i, ("b", i));
        }
        q.push_back("a", 10, 5, ("a", 99));
        q.push_back("a", 100, 6, ("a", 100));
        let order: Vec<_> = std::iter::from_fn(|| q.pop_front(|_| 1)).collect();
        assert_eq!(
            order,
            [
                ("a", 100),
                ("b", 0),
                ("a", 99),
                ("b", 1),
                ("a", 0),
                ("b", 2),
                ("a", 1),
                ("a", 2)
            ]
        );
        assert_eq!(q.len(), 0);
    }
}
