//! Waiting attempts, taken in turn across namespaces and, within a
//! namespace, across jobs; first in, first out within a job. A busy job
//! cannot starve the others, nor a busy namespace the other tenants.

use std::collections::VecDeque;

type Jobs<T> = VecDeque<(String, VecDeque<T>)>;

/// See the module documentation.
pub(crate) struct FairQueue<T> {
    namespaces: VecDeque<(String, Jobs<T>)>,
    len: usize,
}

impl<T> Default for FairQueue<T> {
    fn default() -> FairQueue<T> {
        FairQueue {
            namespaces: VecDeque::new(),
            len: 0,
        }
    }
}

impl<T> FairQueue<T> {
    fn queue(&mut self, namespace: &str, job: &str) -> &mut VecDeque<T> {
        let n = match self.namespaces.iter().position(|(ns, _)| ns == namespace) {
            Some(n) => n,
            None => {
                self.namespaces
                    .push_back((namespace.to_string(), VecDeque::new()));
                self.namespaces.len() - 1
            }
        };
        let jobs = &mut self.namespaces[n].1;
        let j = match jobs.iter().position(|(name, _)| name == job) {
            Some(j) => j,
            None => {
                jobs.push_back((job.to_string(), VecDeque::new()));
                jobs.len() - 1
            }
        };
        &mut jobs[j].1
    }

    /// Queues an item behind the others of its job.
    pub(crate) fn push_back(&mut self, namespace: &str, job: &str, item: T) {
        self.queue(namespace, job).push_back(item);
        self.len += 1;
    }

    /// Queues an item ahead of the others of its job (it waited already).
    pub(crate) fn push_front(&mut self, namespace: &str, job: &str, item: T) {
        self.queue(namespace, job).push_front(item);
        self.len += 1;
    }

    /// Items waiting.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Takes the first item, in turn, that `fits` accepts; the next call
    /// starts with the next namespace, and in this namespace with the next job.
    pub(crate) fn take(&mut self, mut fits: impl FnMut(&T) -> bool) -> Option<T> {
        for n in 0..self.namespaces.len() {
            let jobs = &mut self.namespaces[n].1;
            for j in 0..jobs.len() {
                let Some(i) = jobs[j].1.iter().position(&mut fits) else {
                    continue;
                };
                let item = jobs[j].1.remove(i).expect("present");
                self.len -= 1;
                let entry = jobs.remove(j).expect("present");
                if !entry.1.is_empty() {
                    jobs.push_back(entry);
                }
                let entry = self.namespaces.remove(n).expect("present");
                if !entry.1.is_empty() {
                    self.namespaces.push_back(entry);
                }
                return Some(item);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(q: &mut FairQueue<&'static str>) -> Vec<&'static str> {
        std::iter::from_fn(|| q.take(|_| true)).collect()
    }

    #[test]
    fn jobs_and_namespaces_take_turns() {
        let mut q = FairQueue::default();
        for item in ["a1", "a2", "a3", "a4"] {
            q.push_back("team", "a", item);
        }
        q.push_back("team", "b", "b1");
        q.push_back("other", "c", "c1");
        q.push_back("other", "c", "c2");
        assert_eq!(q.len(), 7);
        // Namespaces alternate; within `team`, jobs a and b alternate.
        assert_eq!(drain(&mut q), ["a1", "c1", "b1", "c2", "a2", "a3", "a4"]);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn what_does_not_fit_keeps_its_place() {
        let mut q = FairQueue::default();
        q.push_back("ns", "gpu", "g1");
        q.push_back("ns", "cpu", "c1");
        q.push_back("ns", "cpu", "c2");
        assert_eq!(q.take(|i| i.starts_with('c')), Some("c1"));
        assert_eq!(q.take(|i| i.starts_with('c')), Some("c2"));
        assert_eq!(q.take(|i| i.starts_with('c')), None);
        q.push_front("ns", "gpu", "g0");
        assert_eq!(drain(&mut q), ["g0", "g1"]);
    }
}
