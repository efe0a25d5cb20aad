//! Waiting attempts, taken in turn across namespaces; within a namespace,
//! by levels of priority (see `dagcron_core::priority`), and within a level
//! in turn across jobs, first in, first out within a job. A busy job cannot
//! starve the others, nor a busy namespace (whatever its priorities) the
//! other tenants.

use std::collections::VecDeque;

use dagcron_core::priority::Levels;

/// A namespace's waiting items: by level, then a queue per job, each item
/// with the instant it became ready.
type Namespace<T> = Levels<Jobs<(i64, T)>>;

/// See the module documentation.
pub(crate) struct FairQueue<T> {
    namespaces: VecDeque<(String, Namespace<T>)>,
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
    fn queue(
        &mut self,
        namespace: &str,
        job: &str,
        priority: i32,
        ready_us: i64,
    ) -> &mut VecDeque<(i64, T)> {
        let n = match self.namespaces.iter().position(|(ns, _)| ns == namespace) {
            Some(n) => n,
            None => {
                self.namespaces
                    .push_back((namespace.to_string(), Levels::default()));
                self.namespaces.len() - 1
            }
        };
        self.len += 1;
        self.namespaces[n].1.push(priority, ready_us).queue(job)
    }

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
        self.queue(namespace, job, priority, ready_us)
            .push_back((ready_us, item));
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
        self.queue(namespace, job, priority, ready_us)
            .push_front((ready_us, item));
    }

    /// Items waiting.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Takes the first item, in turn, that `fits` accepts (in a namespace,
    /// of the level served next that has one); the next call starts with
    /// the next namespace, and in this namespace with the next job.
    pub(crate) fn take(&mut self, mut fits: impl FnMut(&T) -> bool) -> Option<T> {
        for n in 0..self.namespaces.len() {
            let Some((_, item)) = self.namespaces[n]
                .1
                .take(|jobs| jobs.take(|e| fits(&e.1)), |e| e.0)
            else {
                continue;
            };
            self.len -= 1;
            let entry = self.namespaces.remove(n).expect("present");
            if !entry.1.is_empty() {
                self.namespaces.push_back(entry);
            }
            return Some(item);
        }
        None
    }
}

/// A queue per job, taken in turn.
struct Jobs<T>(VecDeque<(String, VecDeque<T>)>);

impl<T> Default for Jobs<T> {
    fn default() -> Jobs<T> {
        Jobs(VecDeque::new())
    }
}

impl<T> Jobs<T> {
    fn queue(&mut self, job: &str) -> &mut VecDeque<T> {
        let j = match self.0.iter().position(|(name, _)| name == job) {
            Some(j) => j,
            None => {
                self.0.push_back((job.to_string(), VecDeque::new()));
                self.0.len() - 1
            }
        };
        &mut self.0[j].1
    }

    /// The first item `fits` accepts, of the first job in turn that has
    /// one; that job's turn passes.
    fn take(&mut self, mut fits: impl FnMut(&T) -> bool) -> Option<T> {
        for j in 0..self.0.len() {
            let Some(i) = self.0[j].1.iter().position(&mut fits) else {
                continue;
            };
            let item = self.0[j].1.remove(i).expect("present");
            let entry = self.0.remove(j).expect("present");
            if !entry.1.is_empty() {
                self.0.push_back(entry);
            }
            return Some(item);
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

    /// A higher priority goes first within its namespace, also when what it
    /// needs is busy (then the next level's items that fit go meanwhile);
    /// another namespace keeps its turn.
    #[test]
    fn levels_within_a_namespace_and_what_fits_meanwhile() {
        let mut q = FairQueue::default();
        q.push_back("ns", "a", 0, 0, "a1");
        q.push_back("ns", "b", 0, 1, "b1");
        q.push_back("ns", "gpu", 50, 2, "g1");
        q.push_back("ns", "c", 50, 3, "c1");
        q.push_back("other", "o", 0, 4, "o1");
        assert_eq!(q.take(|i| !i.starts_with('g')), Some("c1"));
        assert_eq!(q.take(|i| !i.starts_with('g')), Some("o1"));
        assert_eq!(q.take(|i| !i.starts_with('g')), Some("a1"));
        assert_eq!(q.take(|_| true), Some("g1"));
        assert_eq!(drain(&mut q), ["b1"]);
        assert_eq!(q.len(), 0);
    }
}
