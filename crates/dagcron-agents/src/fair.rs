//! Waiting attempts, by levels of priority (see `dagcron_core::priority`);
//! in a level, taken in turn across namespaces and, within a namespace,
//! across jobs; first in, first out within a job. A busy job cannot starve
//! the others, nor a busy namespace the other tenants.

use std::collections::VecDeque;

use dagcron_core::priority::Levels;

type Jobs<T> = VecDeque<(String, VecDeque<T>)>;

/// See the module documentation.
pub(crate) struct FairQueue<T> {
    levels: Levels<Turns<(i64, T)>>,
    len: usize,
}

impl<T> Default for FairQueue<T> {
    fn default() -> FairQueue<T> {
        FairQueue {
            levels: Levels::default(),
            len: 0,
        }
    }
}

impl<T> FairQueue<T> {
    /// Queues an item behind the others of its job, at `priority`, ready
    /// at `ready_us`.
    pub(crate) fn push_back(
        &mut self,
        namespace: &str,
        job: &str,
        priority: i32,
        ready_us: i64,
        item: T,
    ) {
        self.levels
            .push(priority, ready_us)
            .queue(namespace, job)
            .push_back((ready_us, item));
        self.len += 1;
    }

    /// Queues an item ahead of the others of its job (it waited already).
    pub(crate) fn push_front(
        &mut self,
        namespace: &str,
        job: &str,
        priority: i32,
        ready_us: i64,
        item: T,
    ) {
        self.levels
            .push(priority, ready_us)
            .queue(namespace, job)
            .push_front((ready_us, item));
        self.len += 1;
    }

    /// Items waiting.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Takes the first item that `fits` accepts: of the level served next
    /// (or the next level with one that fits), in turn; the next call
    /// starts with the next namespace, and in this namespace with the next job.
    pub(crate) fn take(&mut self, mut fits: impl FnMut(&T) -> bool) -> Option<T> {
        let (_, item) = self.levels.take(|q| q.take(|e| fits(&e.1)), |e| e.0)?;
        self.len -= 1;
        Some(item)
    }
}

/// One level's queue: namespaces in turn, jobs in turn within a namespace.
struct Turns<T> {
    namespaces: VecDeque<(String, Jobs<T>)>,
}

impl<T> Default for Turns<T> {
    fn default() -> Turns<T> {
        Turns {
            namespaces: VecDeque::new(),
        }
    }
}

impl<T> Turns<T> {
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

    fn take(&mut self, mut fits: impl FnMut(&T) -> bool) -> Option<T> {
        for n in 0..self.namespaces.len() {
            let jobs = &mut self.namespaces[n].1;
            for j in 0..jobs.len() {
                let Some(i) = jobs[j].1.iter().position(&mut fits) else {
                    continue;
                };
                let item = jobs[j].1.remove(i).expect("present");
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
            q.push_back("team", "a", 0, 0, item);
        }
        q.push_back("team", "b", 0, 0, "b1");
        q.push_back("other", "c", 0, 0, "c1");
        q.push_back("other", "c", 0, 0, "c2");
        assert_eq!(q.len(), 7);
        // Namespaces alternate; within `team`, jobs a and b alternate.
        assert_eq!(drain(&mut q), ["a1", "c1", "b1", "c2", "a2", "a3", "a4"]);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn what_does_not_fit_keeps_its_place() {
        let mut q = FairQueue::default();
        q.push_back("ns", "gpu", 0, 0, "g1");
        q.push_back("ns", "cpu", 0, 0, "c1");
        q.push_back("ns", "cpu", 0, 0, "c2");
        assert_eq!(q.take(|i| i.starts_with('c')), Some("c1"));
        assert_eq!(q.take(|i| i.starts_with('c')), Some("c2"));
        assert_eq!(q.take(|i| i.starts_with('c')), None);
        q.push_front("ns", "gpu", 0, 0, "g0");
        assert_eq!(drain(&mut q), ["g0", "g1"]);
    }

    /// A higher priority goes first, also when what it needs is busy:
    /// then the next level's items that fit go meanwhile.
    #[test]
    fn levels_first_and_what_fits_meanwhile() {
        let mut q = FairQueue::default();
        q.push_back("ns", "a", 0, 0, "a1");
        q.push_back("ns", "b", 0, 1, "b1");
        q.push_back("ns", "gpu", 50, 2, "g1");
        q.push_back("ns", "c", 50, 3, "c1");
        assert_eq!(q.take(|i| !i.starts_with('g')), Some("c1"));
        assert_eq!(q.take(|i| !i.starts_with('g')), Some("a1"));
        assert_eq!(q.take(|_| true), Some("g1"));
        assert_eq!(drain(&mut q), ["b1"]);
    }
}
