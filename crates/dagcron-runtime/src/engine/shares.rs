//! The pool's ready queue: a queue per namespace, taken in turn, so that
//! a namespace with a backlog cannot keep another's next task out of the
//! pool.

use std::collections::{HashMap, VecDeque};

/// A queue per namespace, taken in turn (first in, first out within a
/// namespace): the pool's slots are shared between namespaces, each with
/// an equal share while several wait.
pub(super) struct Shares<T> {
    queues: HashMap<String, VecDeque<T>>,
    /// The namespaces with something waiting, the next one to take from first.
    turn: VecDeque<String>,
    len: usize,
}

impl<T> Default for Shares<T> {
    fn default() -> Shares<T> {
        Shares {
            queues: HashMap::new(),
            turn: VecDeque::new(),
            len: 0,
        }
    }
}

impl<T> Shares<T> {
    pub(super) fn push_back(&mut self, namespace: &str, item: T) {
        match self.queues.get_mut(namespace) {
            Some(q) => q.push_back(item),
            None => {
                self.queues
                    .insert(namespace.to_string(), VecDeque::from([item]));
                self.turn.push_back(namespace.to_string());
            }
        }
        self.len += 1;
    }

    /// The first item of the namespace whose turn it is; that namespace
    /// goes to the back of the turn.
    pub(super) fn pop_front(&mut self) -> Option<T> {
        let namespace = self.turn.pop_front()?;
        let queue = self.queues.get_mut(&namespace).expect("a queue per turn");
        let item = queue.pop_front().expect("a queue in turn is not empty");
        if queue.is_empty() {
            self.queues.remove(&namespace);
        } else {
            self.turn.push_back(namespace);
        }
        self.len -= 1;
        Some(item)
    }

    pub(super) fn len(&self) -> usize {
        self.len
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
            q.push_back("alpha", ("alpha", i));
        }
        q.push_back("beta", ("beta", 0));
        assert_eq!(q.len(), 601);
        assert_eq!(q.pop_front(), Some(("alpha", 0)));
        assert_eq!(q.pop_front(), Some(("beta", 0)));
        let rest: Vec<_> = std::iter::from_fn(|| q.pop_front()).collect();
        assert_eq!(rest.len(), 599);
        assert!(rest.windows(2).all(|w| w[0].1 < w[1].1), "in order");
        assert_eq!(q.len(), 0);
        assert_eq!(q.pop_front(), None);
    }

    /// Three namespaces waiting take the pool in turn.
    #[test]
    fn namespaces_take_turns() {
        let mut q = Shares::default();
        for ns in ["a", "b", "c"] {
            for i in 0..3 {
                q.push_back(ns, (ns, i));
            }
        }
        let order: Vec<&str> = std::iter::from_fn(|| q.pop_front())
            .map(|(ns, _)| ns)
            .collect();
        assert_eq!(order, ["a", "b", "c", "a", "b", "c", "a", "b", "c"]);
    }
}
